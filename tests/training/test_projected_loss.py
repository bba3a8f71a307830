"""The projected loss (pre-softmax projection and loss a chunk of tokens at a time) against the logits path."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.masks import PAD_ID
from transformer_jax.training.loss import (
    GPU_CHUNK_LOGITS_BYTES,
    accelerator_chunk_tokens,
    label_smoothed_cross_entropy,
    projected_cross_entropy_sums,
)


def logits_path_sums(hidden, table, targets, smoothing, bias=None, dtype=jnp.float32):
    """Today's path: the whole batch's float32 logits, then the loss (what training/step.py computes)."""
    logits = jnp.einsum("btd,vd->btv", hidden.astype(dtype), table.astype(dtype), preferred_element_type=jnp.float32)
    if bias is not None:
        logits = logits + bias
    loss, nll = label_smoothed_cross_entropy(logits, targets, smoothing)
    weights = (targets != PAD_ID).astype(jnp.float32)
    reference = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return {"loss": (loss * weights).sum(), "nll": (nll * weights).sum(),
            "correct": ((reference >= logits.max(-1)) * weights).sum(), "tokens": weights.sum()}


def problem(seed=0, rows=4, width=12, d=16, vocab=37, pads=True):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(rows, width, d)), jnp.float32)
    table = jnp.asarray(rng.normal(size=(vocab, d)) * 0.5, jnp.float32)
    bias = jnp.asarray(rng.normal(size=(vocab,)), jnp.float32)
    targets = rng.integers(1, vocab, size=(rows, width))
    if pads:
        targets[1, 7:] = PAD_ID
        targets[3, 2:] = PAD_ID
    return hidden, table, bias, jnp.asarray(targets, jnp.int32)


@pytest.mark.parametrize("chunk_tokens", [5, 10_000])  # 5: 48 tokens in 10 chunks of 4.8 -> 12 of 4
@pytest.mark.parametrize("smoothing, with_bias", [(0.1, False), (0.0, True), (0.1, True)])
def test_sums_and_gradients_equal_the_logits_path_in_float32(chunk_tokens, smoothing, with_bias):
    hidden, table, bias, targets = problem()
    bias = bias if with_bias else None
    ours = projected_cross_entropy_sums(hidden, table, targets, smoothing, bias_V=bias, chunk_tokens=chunk_tokens)
    reference = logits_path_sums(hidden, table, targets, smoothing, bias)
    for key in reference:
        np.testing.assert_allclose(ours[key], reference[key], rtol=1e-5, err_msg=key)

    def loss_of(fn):
        return lambda h, t, b: fn(h, t, b)["loss"] * 0.37  # a cotangent other than 1
    ours_grads = jax.grad(loss_of(lambda h, t, b: projected_cross_entropy_sums(
        h, t, targets, smoothing, bias_V=b, chunk_tokens=chunk_tokens)), argnums=(0, 1, 2))(hidden, table, bias)
    reference_grads = jax.grad(loss_of(lambda h, t, b: logits_path_sums(h, t, targets, smoothing, b)),
                               argnums=(0, 1, 2))(hidden, table, bias)
    for name, a, b in zip(("hidden", "table", "bias"), ours_grads, reference_grads):
        if b is not None:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=name)
    # Padding positions get no gradient.
    assert not np.any(np.asarray(ours_grads[0])[3, 2:])


def test_gpus_take_the_largest_chunk_whose_logits_fit_the_budget_and_tpus_keep_theirs():
    assert accelerator_chunk_tokens("gpu", 8000) == 33554  # 1 GiB of float32 logits: the paper's batch in one chunk
    assert accelerator_chunk_tokens("gpu", 37000) == 7255  # 25k tokens in 4 chunks
    assert 4 * 37000 * accelerator_chunk_tokens("gpu", 37000) <= GPU_CHUNK_LOGITS_BYTES
    assert accelerator_chunk_tokens("gpu", 2**20) == 1024  # never below the TPUs' chunk
    assert accelerator_chunk_tokens("tpu", 8000) == 1024


@pytest.mark.parametrize("kernel", [False, True])  # XLA's chunks; the fused kernels (training/loss_kernel.py)
def test_bfloat16_matmuls_stay_close_and_the_table_gradient_keeps_its_dtype(kernel):
    hidden, table, _, targets = problem(seed=1, d=32, vocab=101)
    hidden = hidden.astype(jnp.bfloat16)
    grads = jax.grad(lambda h, t: projected_cross_entropy_sums(h, t, targets, 0.1, dtype=jnp.bfloat16, chunk_tokens=8,
                                                               kernel=kernel)["loss"], argnums=(0, 1))(hidden, table)
    reference = jax.grad(lambda h, t: logits_path_sums(h, t, targets, 0.1, dtype=jnp.bfloat16)["loss"],
                         argnums=(0, 1))(hidden, table)
    assert grads[0].dtype == jnp.bfloat16 and grads[1].dtype == jnp.float32
    for a, b in zip(grads, reference):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 0.02 * np.abs(b).max()


def test_no_vocabulary_sized_array_is_kept_for_the_backward_pass_but_the_table_gradient():
    hidden, table, _, targets = problem(rows=8, width=32, vocab=500)
    _, backward = jax.vjp(lambda h, t: projected_cross_entropy_sums(h, t, targets, 0.1, chunk_tokens=64)["loss"],
                          hidden, table)
    shapes = [np.shape(leaf) for leaf in jax.tree.leaves(backward)]
    assert sorted(shapes, key=np.prod)[-2:] == [hidden.shape, table.shape], shapes


MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, sys
sys.path.insert(0, sys.argv[1])
from test_projected_loss import problem, logits_path_sums
from transformer_jax.base.sharding import make_mesh, batch_sharding
from transformer_jax.training.loss import projected_cross_entropy_sums
kernel = sys.argv[2] == "kernel"  # the fused kernels (no output bias), else XLA's chunks
mesh = make_mesh(data=2, fsdp=2)
hidden, table, bias, targets = problem(rows=8)
bias = None if kernel else bias
hidden, targets = (jax.device_put(x, batch_sharding(mesh)) for x in (hidden, targets))
fn = jax.jit(jax.value_and_grad(lambda h, t, b: projected_cross_entropy_sums(
    h, t, targets, 0.1, bias_V=b, chunk_tokens=8, mesh=mesh, kernel=kernel)["loss"], argnums=(0, 1, 2)))
ref = jax.value_and_grad(lambda h, t, b: logits_path_sums(h, t, targets, 0.1, b)["loss"], argnums=(0, 1, 2))
(loss, grads), (ref_loss, ref_grads) = fn(hidden, table, bias), ref(hidden, table, bias)
np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
for a, b in zip(grads, ref_grads):
    if b is not None:
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
text = fn.lower(hidden, table, bias).compile().as_text()
print("all-reduces", text.count(" all-reduce("), "ok")
"""


@pytest.mark.parametrize("path", ["chunks", "kernel"])
def test_on_a_mesh_each_device_takes_its_rows_and_the_sums_meet_once(path):
    from runs import cpu_xla_flags  # here: the script imports this module where tests/ is not on the path

    env = dict(os.environ, XLA_FLAGS=cpu_xla_flags(4), JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", MESH_SCRIPT, os.path.dirname(__file__), path], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok"), run.stdout
