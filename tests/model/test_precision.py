"""float32_dot_outputs: the model's matmuls return float32 and round after; nothing else changes."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import Transformer, TransformerConfig

CONFIG = TransformerConfig.preset("tiny", vocab_size=50, max_len=32)
SRC = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 11, 12, 13], [2, 14, 0, 0]], jnp.int32)


def _params(config: TransformerConfig):
    return nn.meta.unbox(jax.jit(Transformer(config).init)(jax.random.key(0), SRC, TGT)["params"])


def _forward(config: TransformerConfig, params) -> jax.Array:
    return jax.jit(Transformer(config).apply)({"params": params}, SRC, TGT)


def _dot_output_types(config: TransformerConfig, params) -> set[str]:
    """The element types the forward pass's dot_general ops return (from the jaxpr's text)."""
    text = str(jax.make_jaxpr(lambda p: Transformer(config).apply({"params": p}, SRC, TGT))(params))
    return {match for match in re.findall(r"(\w+)\[[\d,]*\] = dot_general", text)}


def test_float32_dot_outputs_leave_a_float32_model_unchanged():
    params = _params(CONFIG)
    plain = _forward(CONFIG, params)
    flagged = _forward(CONFIG.replace(float32_dot_outputs=True), params)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(flagged))


def test_bfloat16_matmuls_return_float32_only_with_the_flag():
    config = CONFIG.replace(dtype="bfloat16", param_dtype="bfloat16")
    params = _params(config)
    # Without the flag the projections return bfloat16 (XLA:CPU then emulates them in float32).
    assert "bf16" in _dot_output_types(config, params)
    flagged = config.replace(float32_dot_outputs=True)
    assert _dot_output_types(flagged, params) == {"f32"}
    # The same model: the two differ only by bfloat16 rounding of intermediate sums.
    plain, rounded_after = _forward(config, params), _forward(flagged, params)
    assert plain.dtype == rounded_after.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(plain), np.asarray(rounded_after), atol=0.1)
    assert (np.asarray(plain).argmax(-1) == np.asarray(rounded_after).argmax(-1)).mean() >= 0.75
