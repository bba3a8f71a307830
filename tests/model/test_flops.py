"""Analytic FLOP counts equal XLA's own count of the compiled forward pass's matmuls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model.flops import (
    forward_flops,
    model_flops_utilization,
    train_step_flops,
)


def _xla_dot_flops(config, rows, source_length, target_length):
    model = Transformer(config)
    src = jnp.ones((rows, source_length), jnp.int32)
    tgt = jnp.ones((rows, target_length), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), src, tgt))["params"]
    compiled = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t)).lower(params, src, tgt).compile()
    return compiled.cost_analysis()["flops"]


@pytest.mark.parametrize("rows,source_length,target_length", [(2, 12, 7), (3, 16, 16)])
def test_forward_count_matches_xla_cost_analysis(rows, source_length, target_length):
    config = TransformerConfig.preset("tiny", vocab_size=300, max_len=32)
    ours = forward_flops(config, rows, source_length, target_length)
    xla = _xla_dot_flops(config, rows, source_length, target_length)
    # XLA also counts elementwise work (softmax, LayerNorm, biases): a few percent on top of the matmuls.
    assert ours <= xla <= 1.15 * ours, (ours, xla)


def test_base_model_step_and_mfu_arithmetic():
    config = TransformerConfig()  # the paper's base model
    per_step = train_step_flops(config, rows=1, source_length=1, target_length=1)
    # One token each side: 6 x (params touched by matmuls) plus 6 x 4 x d of attention per layer.
    encoder = 6 * (4 * 512 * 512 + 2 * 512 * 2048)
    decoder = 6 * (8 * 512 * 512 + 2 * 512 * 2048) + 512 * 37000
    attention = 6 * 3 * 2 * 512  # self (encoder), self and cross (decoder): QK^T and AV, one key each
    assert per_step == 6 * (encoder + decoder + attention)
    np.testing.assert_allclose(model_flops_utilization(2e12, 2.0, 2e12), 0.5)
