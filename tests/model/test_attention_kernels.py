"""The splash attention kernel (Pallas' interpreter on CPU) against the einsum path, and "auto"'s choices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model import attention_kernels
from transformer_jax.model.attention import scaled_dot_product_attention
from transformer_jax.model.attention_kernels import SegmentedMask, resolve_backend


def packed_rows(rng, rows, width, pad_from):
    """Token ids and segment ids of rows holding two pairs each, padded from `pad_from`."""
    tokens = rng.integers(4, 50, size=(rows, width))
    segments = np.where(np.arange(width) < width // 3, 1, 2)[None].repeat(rows, 0)
    tokens[:, pad_from:], segments[:, pad_from:] = 0, 0
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(segments, jnp.int32)


@pytest.mark.parametrize("causal, kv_width", [(True, 128), (False, 128), (False, 256)])
def test_splash_equals_einsum_where_queries_have_keys_values_and_gradients(causal, kv_width):
    rng = np.random.default_rng(0)
    q_tokens, q_segments = packed_rows(rng, 2, 128, 100)
    kv_tokens, kv_segments = packed_rows(rng, 2, kv_width, kv_width - 20)
    if not causal and kv_width == 128:
        q_segments = kv_segments = None  # plain rows: padding alone
    mask = SegmentedMask.of(q_tokens, kv_tokens, q_segments, kv_segments, causal=causal)
    q, k, v = (jnp.asarray(rng.normal(size=(2, width, 2, 16)), jnp.float32) for width in (128, kv_width, kv_width))
    cotangent = jnp.asarray(rng.normal(size=(2, 128, 2, 16)), jnp.float32)
    has_key = np.asarray(mask.dense().any(-1))[:, 0, :, None, None]  # [B, T, 1, 1]

    def loss(backend, mask):
        return lambda q, k, v: (scaled_dot_product_attention(q, k, v, mask, backend=backend) * cotangent * has_key).sum()

    splash = scaled_dot_product_attention(q, k, v, mask, backend="splash")
    einsum = scaled_dot_product_attention(q, k, v, mask.dense(), backend="einsum")
    np.testing.assert_allclose(np.where(has_key, splash, 0), einsum, atol=2e-6)
    grads = jax.grad(loss("splash", mask), argnums=(0, 1, 2))(q, k, v)
    reference = jax.grad(loss("einsum", mask.dense()), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", grads, reference):
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=name)
    assert np.all(np.isfinite(splash))  # queries without keys: meaningless values, never NaN


def test_a_transformer_with_splash_gives_the_einsum_transformers_logits_on_packed_rows():
    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=256, dropout_rate=0.0, num_heads=2)
    rng = np.random.default_rng(1)
    src, src_segments = packed_rows(rng, 2, 128, 120)
    tgt, tgt_segments = packed_rows(rng, 2, 128, 110)
    positions = jnp.asarray(np.tile(np.arange(128), (2, 1)), jnp.int32)
    model = Transformer(config.replace(attention_backend="einsum"))
    params = model.init(jax.random.key(0), src, tgt)["params"]
    inputs = dict(src_positions=positions, tgt_positions=positions, src_segments=src_segments,
                  tgt_segments=tgt_segments)
    reference = model.apply({"params": params}, src, tgt, **inputs)
    splash = Transformer(config.replace(attention_backend="splash")).apply({"params": params}, src, tgt, **inputs)
    real = np.asarray(tgt) != 0
    np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(reference)[real], atol=2e-4)


def test_auto_is_einsum_on_cpus_and_with_attention_dropout(monkeypatch):
    monkeypatch.setattr(attention_kernels, "kernel_platform", lambda: "cpu")  # what a CPU host is, on any host
    assert resolve_backend("auto", 0.0) == "einsum"
    assert resolve_backend("auto", 0.1) == "einsum"
    assert resolve_backend("splash", 0.0) == "splash" and resolve_backend("fused", 0.0) == "fused"
    assert TransformerConfig(attention_backend="splash").runnable_on("cpu").attention_backend == "einsum"
    assert TransformerConfig(attention_backend="splash").runnable_on("tpu").attention_backend == "splash"


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU (hardware check)")
def test_auto_on_a_gpu_is_cudnn_and_gives_the_einsum_transformers_logits_on_packed_rows():
    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=256, dropout_rate=0.0, num_heads=2,
                                      d_model=128, dtype="bfloat16")
    assert resolve_backend("auto", 0.0, jnp.bfloat16) == "cudnn"
    rng = np.random.default_rng(2)
    src, src_segments = packed_rows(rng, 4, 128, 120)
    tgt, tgt_segments = packed_rows(rng, 4, 128, 110)
    positions = jnp.asarray(np.tile(np.arange(128), (4, 1)), jnp.int32)
    inputs = dict(src_positions=positions, tgt_positions=positions, src_segments=src_segments,
                  tgt_segments=tgt_segments)
    model = Transformer(config.replace(attention_backend="einsum"))
    params = model.init(jax.random.key(0), src, tgt)["params"]
    reference = np.asarray(model.apply({"params": params}, src, tgt, **inputs), np.float32)
    auto = Transformer(config.replace(attention_backend="auto"))
    text = jax.jit(lambda p: auto.apply({"params": p}, src, tgt, **inputs)).lower(params).compile().as_text()
    assert "cudnn" in text.lower(), "no cuDNN attention in the compiled program"
    logits = np.asarray(auto.apply({"params": params}, src, tgt, **inputs), np.float32)
    real = np.asarray(tgt) != 0
    assert np.abs(logits[real] - reference[real]).max() <= 0.05 * np.abs(reference[real]).max()
