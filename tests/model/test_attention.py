"""Scaled dot-product and multi-head attention against a float64 NumPy reference."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.attention import (
    MultiHeadAttention,
    attention_weights,
    scaled_dot_product_attention,
)
from transformer_jax.model.masks import causal_mask, combine_masks, padding_mask


def reference_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d_k)) v in float64; q [B,T,H,K], mask bool broadcastable to [B,H,T,S]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    mask = np.broadcast_to(np.asarray(mask), logits.shape)
    logits = np.where(mask, logits, -np.inf)
    row_max = np.max(np.where(mask, logits, -1e300), axis=-1, keepdims=True)
    exp = np.where(mask, np.exp(logits - row_max), 0.0)
    denom = exp.sum(-1, keepdims=True)
    weights = np.divide(exp, denom, out=np.zeros_like(exp), where=denom > 0)
    return np.einsum("bhts,bshk->bthk", weights, v)


def relative_error(actual, expected):
    return np.max(np.abs(np.asarray(actual, np.float64) - expected)) / np.max(np.abs(expected))


@pytest.fixture
def qkv_and_mask():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    k = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    v = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    tokens = jnp.array([[4, 5, 6, 7, 8], [4, 5, 6, 0, 0]])
    mask = combine_masks(padding_mask(tokens, tokens), causal_mask(5))
    return q, k, v, mask


@pytest.mark.parametrize("backend", ["einsum", "fused"])
def test_attention_matches_float64_reference(qkv_and_mask, backend):
    q, k, v, mask = qkv_and_mask
    out = scaled_dot_product_attention(q, k, v, mask, backend=backend)
    expected = reference_attention(q, k, v, mask)
    assert relative_error(out, expected) < 1e-5


def test_backends_agree_without_mask(qkv_and_mask):
    q, k, v, _ = qkv_and_mask
    einsum = scaled_dot_product_attention(q, k, v, None, backend="einsum")
    fused = scaled_dot_product_attention(q, k, v, None, backend="fused")
    np.testing.assert_allclose(einsum, fused, rtol=1e-5, atol=1e-6)
    assert relative_error(einsum, reference_attention(q, k, v, np.ones((1, 1, 5, 5), bool))) < 1e-5


@pytest.mark.parametrize("backend", ["einsum", "fused"])
def test_fully_masked_rows_are_finite_zeros(qkv_and_mask, backend):
    q, k, v, _ = qkv_and_mask
    mask = np.ones((2, 1, 5, 5), bool)
    mask[1, :, 2, :] = False  # query 2 of sentence 1 may attend to nothing
    out = scaled_dot_product_attention(q, k, v, jnp.asarray(mask), backend=backend)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1, 2], 0.0)
    grads = jax.grad(lambda q: scaled_dot_product_attention(q, k, v, jnp.asarray(mask), backend=backend).sum())(q)
    assert np.all(np.isfinite(grads))


def _per_head_masks():
    """Masks of every broadcastable form, with fully masked query rows in some heads only."""
    rng = np.random.default_rng(2)
    per_head = rng.random((2, 3, 5, 5)) < 0.6
    per_head[0, 0, 1, :] = False  # head 0 of sentence 0: query 1 may attend to nothing ...
    per_head[0, 1, 1, :] = True  # ... while head 1 of the same query attends everywhere
    per_head[1, 2, :, :] = False  # every query of head 2 in sentence 1
    one_batch = rng.random((1, 3, 5, 5)) < 0.5
    one_batch[0, 1, 4, :] = False
    shared = np.ones((1, 1, 5, 5), bool)
    shared[0, 0, 3, :] = False  # one query row of every sentence and head
    keys = np.array([[[[True, False, True, False, False]]], [[[False] * 5]]])  # [B, 1, 1, S]
    return {"BxHxTxS": per_head, "1xHxTxS": one_batch, "1x1xTxS": shared, "Bx1x1xS": keys,
            "TxS": shared[0, 0]}


@pytest.mark.parametrize("form", list(_per_head_masks()))
def test_backends_agree_and_zero_fully_masked_rows_per_head(qkv_and_mask, form):
    q, k, v, _ = qkv_and_mask
    mask = _per_head_masks()[form]
    einsum = scaled_dot_product_attention(q, k, v, jnp.asarray(mask), backend="einsum")
    fused = scaled_dot_product_attention(q, k, v, jnp.asarray(mask), backend="fused")
    np.testing.assert_allclose(fused, einsum, rtol=1e-5, atol=1e-6)
    # [B, T, H] True where a query has no allowed key in that head.
    empty_BxTxH = np.swapaxes(~np.broadcast_to(mask, (2, 3, 5, 5)).any(-1), 1, 2)
    assert empty_BxTxH.any() and not empty_BxTxH.all()
    if form == "BxHxTxS":  # a query empty in one head but not in another
        assert np.any(empty_BxTxH.any(axis=2) & ~empty_BxTxH.all(axis=2))
    for out in (einsum, fused):
        out = np.asarray(out)
        assert np.all(out[empty_BxTxH] == 0.0)
        assert np.all(np.abs(out[~empty_BxTxH]).sum(-1) > 0)
    assert relative_error(fused, reference_attention(q, k, v, mask)) < 1e-5


def test_attention_weights_rows_sum_to_one_and_respect_mask(qkv_and_mask):
    q, k, _, mask = qkv_and_mask
    weights = attention_weights(q, k, mask)
    assert weights.dtype == jnp.float32
    np.testing.assert_allclose(weights[0].sum(-1), 1.0, rtol=1e-6)
    assert float(jnp.abs(jnp.where(mask, 0.0, weights)).max()) == 0.0


def test_softmax_runs_in_float32_for_bfloat16_inputs(qkv_and_mask):
    q, k, _, mask = qkv_and_mask
    weights = attention_weights(jnp.asarray(q, jnp.bfloat16), jnp.asarray(k, jnp.bfloat16), mask)
    assert weights.dtype == jnp.float32
    np.testing.assert_allclose(weights, attention_weights(q, k, mask), atol=2e-2)


@pytest.mark.parametrize("backend", ["einsum", "fused"])
def test_multi_head_attention_matches_reference(backend):
    rng = np.random.default_rng(1)
    d_model, heads = 16, 4
    x = rng.standard_normal((2, 6, d_model)).astype(np.float32)
    memory = rng.standard_normal((2, 7, d_model)).astype(np.float32)
    src = jnp.array([[4, 5, 6, 7, 8, 9, 10], [4, 5, 6, 7, 0, 0, 0]])
    tgt = jnp.array([[4, 5, 6, 7, 8, 9], [4, 5, 6, 0, 0, 0]])
    mask = padding_mask(tgt, src)
    module = MultiHeadAttention(num_heads=heads, d_model=d_model, backend=backend)
    params = module.init(jax.random.key(0), x, memory, mask)["params"]
    out = module.apply({"params": params}, x, memory, mask)

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
    project = lambda inp, name: np.einsum("btd,dhk->bthk", inp, p[name]["kernel"]) + p[name].get("bias", 0.0)
    heads_out = reference_attention(project(x, "query"), project(memory, "key"), project(memory, "value"), mask)
    expected = np.einsum("bthk,hkd->btd", heads_out, p["out"]["kernel"]) + p["out"]["bias"]
    assert relative_error(out, expected) < 1e-5
    assert p["query"]["kernel"].shape == (d_model, heads, d_model // heads)
    assert "bias" not in p["key"]  # the softmax cancels a key bias


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU (hardware check)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_cudnn_attention_matches_the_float64_reference_on_gpu(dtype):
    """On a GPU: the cuDNN flash-attention path, forward and gradient, against float64 (and einsum)."""
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((4, 128, 8, 64)), dtype) for _ in range(3))
    tokens = jnp.asarray(np.where(np.arange(128) < np.array([[128], [100], [64], [7]]), 5, 0))
    mask = combine_masks(padding_mask(tokens, tokens), causal_mask(128))
    out = scaled_dot_product_attention(q, k, v, mask, backend="cudnn")
    assert relative_error(out, reference_attention(q, k, v, mask)) < 2e-2
    loss = lambda backend: lambda q: jnp.sum(scaled_dot_product_attention(q, k, v, mask, backend=backend)
                                             .astype(jnp.float32) ** 2)
    cudnn_grad, einsum_grad = jax.grad(loss("cudnn"))(q), jax.grad(loss("einsum"))(q)
    assert relative_error(cudnn_grad, np.asarray(einsum_grad, np.float64)) < 5e-2
