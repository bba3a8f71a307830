"""The fused Pallas loss kernels (training/loss_kernel.py), run by Pallas' interpreter on this CPU, against the
whole batch's logits; and which loss a run's platform and settings pick."""

import jax
import numpy as np
import pytest

from test_projected_loss import logits_path_sums, problem
from transformer_jax.aot import describe, mesh_for
from transformer_jax.base.sharding import make_mesh
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.loss import projected_cross_entropy_sums, projected_loss_for
from transformer_jax.training.loss_kernel import TOKEN_BLOCK, VOCAB_BLOCK


# Token and vocabulary counts off the kernels' blocks (padded inside), one over two blocks of each, and a vocabulary
# that a block divides (no padding: 1,280 in one block).
@pytest.mark.parametrize("rows, width, vocab",
                         [(4, 12, 37), (4, TOKEN_BLOCK // 2 + 5, VOCAB_BLOCK + 300), (4, 40, 1280)])
@pytest.mark.parametrize("smoothing", [0.1, 0.0])
def test_sums_and_gradients_equal_the_logits_path_in_float32(rows, width, vocab, smoothing):
    hidden, table, _, targets = problem(rows=rows, width=width, vocab=vocab)
    ours = projected_cross_entropy_sums(hidden, table, targets, smoothing, kernel=True)
    reference = logits_path_sums(hidden, table, targets, smoothing)
    for key in reference:
        np.testing.assert_allclose(ours[key], reference[key], rtol=1e-5, err_msg=key)
    grads = jax.grad(lambda h, t: projected_cross_entropy_sums(h, t, targets, smoothing, kernel=True)["loss"] * 0.37,
                     argnums=(0, 1))(hidden, table)
    expected = jax.grad(lambda h, t: logits_path_sums(h, t, targets, smoothing)["loss"] * 0.37,
                        argnums=(0, 1))(hidden, table)
    for name, a, b in zip(("hidden", "table"), grads, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
    assert not np.any(np.asarray(grads[0])[3, 2:])  # padding positions get no gradient


def test_an_output_bias_is_refused_by_the_kernel():
    hidden, table, bias, targets = problem()
    with pytest.raises(ValueError, match="no output bias"):
        projected_cross_entropy_sums(hidden, table, targets, 0.1, bias_V=bias, kernel=True)


def test_a_run_picks_the_kernel_on_tpus_only_and_where_it_is_asked_for():
    mesh = make_mesh(devices=jax.devices()[:1])
    tied, biased = TransformerConfig(), TransformerConfig(output_bias=True)
    assert projected_loss_for(-1, tied, mesh, "auto") is None  # CPUs: the whole batch's logits
    assert projected_loss_for(-1, tied, mesh, "pallas").kernel
    assert not projected_loss_for(512, tied, mesh, "auto").kernel  # xla chunks on CPUs
    assert projected_loss_for(0, tied, mesh, "pallas") is None  # 0: the whole batch's logits, always
    tpu = mesh_for(describe("v5e-8"), -1, 1)  # libtpu's compile-only devices
    assert projected_loss_for(-1, tied, tpu, "auto").kernel
    assert not projected_loss_for(-1, biased, tpu, "auto").kernel  # the kernels have no output bias
    assert not projected_loss_for(-1, tied, tpu, "xla").kernel



def test_blocks_fit_the_chip_s_vector_memory():
    from transformer_jax.training.loss_kernel import VMEM_BUDGET, _working_set, blocks

    assert blocks(32000, 512, 2) == (TOKEN_BLOCK, 1280)  # v5e and later: the largest blocks, 1,280 divides 32,000
    for vocab in (32000, 37000):
        for width in (512, 1024):
            token_block, vocab_block = blocks(vocab, width, 2, "small")  # TPU v2-v4: 16 MiB per core
            assert _working_set(token_block, vocab_block, width, 2) <= VMEM_BUDGET["small"]
            assert token_block % 128 == 0 and vocab_block % 128 == 0
    assert blocks(32000, 1024, 2, "small") < blocks(32000, 1024, 2)
    # The chip compiled for (the context mesh's compile-only devices) picks the budget.
    from transformer_jax.training.loss_kernel import _vmem

    for topology, vmem in (("v4-8", "small"), ("v5e-8", "large")):
        with jax.set_mesh(mesh_for(describe(topology), -1, 1)):
            assert _vmem() == vmem, topology
    assert _vmem() == "large"  # this CPU host
