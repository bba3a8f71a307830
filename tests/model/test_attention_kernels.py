"""The splash attention kernel (Pallas' interpreter on CPU) against the einsum path, and "auto"'s choices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model import attention_kernels
from transformer_jax.model.attention import scaled_dot_product_attention
from transformer_jax.model.attention_kernels import (
    SegmentedMask,
    command_buffer_flags,
    kernel_mask,
    resolve_backend,
)


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


def padded_packed_batch(rng, rows, width, vocab=50):
    """Packed rows padded at the end, and a last row of padding alone: queries whose keys are all masked in every
    attention (encoder, decoder, cross)."""
    src, src_segments = packed_rows(rng, rows, width, width - 9)
    tgt, tgt_segments = packed_rows(rng, rows, width, width - 17)
    src, src_segments, tgt, tgt_segments = (a.at[-1].set(0) for a in (src, src_segments, tgt, tgt_segments))
    positions = jnp.asarray(np.tile(np.arange(width), (rows, 1)), jnp.int32)
    labels = jnp.asarray(rng.integers(4, vocab, size=(rows, width)), jnp.int32)
    return dict(src=src, tgt=tgt, labels=labels, inputs=dict(src_positions=positions, tgt_positions=positions,
                                                             src_segments=src_segments, tgt_segments=tgt_segments))


def loss_and_grads(config, backend, params, batch):
    """The mean NLL of `batch`'s labels at its real target positions, and its gradient for every parameter."""
    model = Transformer(config.replace(attention_backend=backend))
    real = batch["tgt"] != 0

    def loss(params):
        logits = model.apply({"params": params}, batch["src"], batch["tgt"], **batch["inputs"])
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), batch["labels"][..., None], -1)
        return jnp.sum(jnp.where(real, nll[..., 0], 0.0)) / jnp.sum(real)

    return jax.jit(jax.value_and_grad(loss))(params)


def test_the_fused_kernels_mask_gives_every_query_a_key_and_keeps_the_others_rows():
    rng = np.random.default_rng(3)
    batch = padded_packed_batch(rng, 3, 24)
    segments = batch["inputs"]
    for causal, queries, keys in ((False, "src", "src"), (True, "tgt", "tgt"), (False, "tgt", "src")):
        dense = np.asarray(SegmentedMask.of(batch[queries], batch[keys], segments[f"{queries}_segments"],
                                            segments[f"{keys}_segments"], causal).dense())
        given, has_key = (np.asarray(a) for a in kernel_mask(jnp.asarray(dense)))
        empty = ~dense.any(-1)
        assert empty[-1].all() and empty[:-1].any() and not empty.all()  # padding queries, a row of padding
        assert given.any(-1).all()  # what the kernel is given: no query without a key
        np.testing.assert_array_equal(has_key[..., 0], ~empty)
        np.testing.assert_array_equal(given[~empty], dense[~empty])  # queries with keys: their own mask
        assert given[empty].all()  # the others attend to every key, their outputs zeroed after


def test_the_mask_handed_to_jax_attention_has_no_query_without_a_key(monkeypatch):
    """What scaled_dot_product_attention hands jax.nn.dot_product_attention (the same call for "cudnn")."""
    handed = []
    real_attention = jax.nn.dot_product_attention

    def recording(*args, mask=None, **kwargs):
        handed.append(np.asarray(mask))
        return real_attention(*args, mask=mask, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    rng = np.random.default_rng(4)
    batch = padded_packed_batch(rng, 3, 24)
    mask = SegmentedMask.of(batch["tgt"], batch["tgt"], batch["inputs"]["tgt_segments"],
                            batch["inputs"]["tgt_segments"], causal=True)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 24, 2, 8)), jnp.float32) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v, mask, backend="fused")
    assert len(handed) == 1 and handed[0].any(-1).all()
    empty_BxT = ~np.asarray(mask.dense()).any(-1)[:, 0]
    assert empty_BxT.any() and np.all(np.asarray(out)[empty_BxT] == 0.0)


def test_a_transformer_with_fused_attention_has_the_einsum_loss_and_gradients_with_padding_queries():
    """Packed rows with padding and a row of padding alone: loss and every gradient as the einsum path's."""
    config = TransformerConfig.preset("tiny", vocab_size=50, dropout_rate=0.0, num_heads=2, d_model=32, d_ff=64,
                                      num_layers=1)
    rng = np.random.default_rng(5)
    batch = padded_packed_batch(rng, 3, 24)
    params = jax.jit(Transformer(config).init)(jax.random.key(0), batch["src"], batch["tgt"])["params"]
    loss, grads = loss_and_grads(config, "fused", params, batch)
    reference_loss, reference_grads = loss_and_grads(config, "einsum", params, batch)
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-6)
    leaves = jax.tree_util.tree_leaves_with_path(grads)
    assert len(leaves) == len(jax.tree.leaves(reference_grads)) > 10
    for (path, grad), reference in zip(leaves, jax.tree.leaves(reference_grads)):
        assert np.all(np.isfinite(grad)), jax.tree_util.keystr(path)
        np.testing.assert_allclose(grad, reference, atol=2e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_auto_on_a_gpu_is_the_kernel_proven_there_and_cudnn_only_where_cudnn_is(monkeypatch):
    monkeypatch.setattr(attention_kernels, "kernel_platform", lambda: "gpu")  # what a GPU host is, on any host
    assert attention_kernels.GPU_AUTO_BACKEND == "fused"  # until the cuDNN training test passes on a GPU
    assert resolve_backend("auto", 0.0, jnp.bfloat16) == "fused"
    assert resolve_backend("auto", 0.0, jnp.float32) == "einsum" and resolve_backend("auto", 0.1) == "einsum"
    monkeypatch.setattr(attention_kernels, "GPU_AUTO_BACKEND", "cudnn")  # the one-line promotion
    monkeypatch.setattr(attention_kernels, "cudnn_available", lambda: False)
    assert resolve_backend("auto", 0.0, jnp.bfloat16) == "fused"
    monkeypatch.setattr(attention_kernels, "cudnn_available", lambda: True)
    assert resolve_backend("auto", 0.0, jnp.bfloat16) == "cudnn"


def test_cudnn_is_taken_out_of_xlas_command_buffers_only_where_attention_may_run_it(monkeypatch):
    without = "--xla_gpu_enable_command_buffer=-CUDNN"
    assert command_buffer_flags("", "cudnn", 0.0, "bfloat16") == without
    assert command_buffer_flags("--xla_dump_to=/tmp/x", "cudnn", 0.0, "bfloat16") == f"--xla_dump_to=/tmp/x {without}"
    user = "--xla_gpu_enable_command_buffer=FUSION --xla_dump_to=/tmp/x"
    assert command_buffer_flags(user, "cudnn", 0.0, "bfloat16") == user  # the user's own choice
    assert command_buffer_flags("--xla_gpu_enable_command_buffer=", "cudnn", 0.0, "bfloat16").endswith("buffer=")
    for backend in ("auto", "fused", "einsum", "splash"):
        assert command_buffer_flags("", backend, 0.0, "bfloat16") == ""
    monkeypatch.setattr(attention_kernels, "GPU_AUTO_BACKEND", "cudnn")
    assert command_buffer_flags("", "auto", 0.0, "bfloat16") == without
    assert command_buffer_flags("", "auto", 0.0, "float32") == "" == command_buffer_flags("", "auto", 0.1, "bfloat16")


def test_auto_is_einsum_on_cpus_and_with_attention_dropout(monkeypatch):
    monkeypatch.setattr(attention_kernels, "kernel_platform", lambda: "cpu")  # what a CPU host is, on any host
    assert resolve_backend("auto", 0.0) == "einsum"
    assert resolve_backend("auto", 0.1) == "einsum"
    assert resolve_backend("splash", 0.0) == "splash" and resolve_backend("fused", 0.0) == "fused"
    assert TransformerConfig(attention_backend="splash").runnable_on("cpu").attention_backend == "einsum"
    assert TransformerConfig(attention_backend="splash").runnable_on("tpu").attention_backend == "splash"


ON_GPU = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU (hardware check)")


@ON_GPU
@pytest.mark.parametrize("width", [128, 192])  # 192: a last key tile of 64, as GPU rows (multiples of 64) have
def test_cudnn_gives_the_einsum_loss_and_gradients_on_a_gpu(width):
    """cuDNN's attention in a bfloat16 Transformer, packed rows with padding and a row of padding alone: the loss
    and every gradient finite and as the einsum path's. Passing on a GPU is what lets "auto" pick cuDNN there
    (attention_kernels.GPU_AUTO_BACKEND)."""
    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=256, dropout_rate=0.0, num_heads=2,
                                      d_model=128, dtype="bfloat16")
    batch = padded_packed_batch(np.random.default_rng(6), 4, width)
    params = jax.jit(Transformer(config).init)(jax.random.key(0), batch["src"], batch["tgt"])["params"]
    model = Transformer(config.replace(attention_backend="cudnn"))
    text = jax.jit(lambda p: model.apply({"params": p}, batch["src"], batch["tgt"], **batch["inputs"])
                   ).lower(params).compile().as_text()
    assert "__cudnn$" in text, "no cuDNN attention in the compiled program"
    loss, grads = loss_and_grads(config, "cudnn", params, batch)
    reference_loss, reference_grads = loss_and_grads(config, "einsum", params, batch)
    assert np.isfinite(loss) and abs(float(loss) - float(reference_loss)) <= 2e-2 * abs(float(reference_loss))
    for (path, grad), reference in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(reference_grads)):
        grad, reference = np.asarray(grad, np.float64), np.asarray(reference, np.float64)
        assert np.all(np.isfinite(grad)), jax.tree_util.keystr(path)
        # bfloat16 attention by another algorithm: the gradient as a whole agrees, not each element
        error = np.linalg.norm(grad - reference) / max(np.linalg.norm(reference), 1e-12)
        assert error < 5e-2, (jax.tree_util.keystr(path), error)


@ON_GPU
def test_auto_on_a_gpu_is_the_proven_kernel_and_gives_the_einsum_transformers_logits_on_packed_rows():
    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=256, dropout_rate=0.0, num_heads=2,
                                      d_model=128, dtype="bfloat16")
    assert resolve_backend("auto", 0.0, jnp.bfloat16) == attention_kernels.GPU_AUTO_BACKEND
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
    cudnn = "__cudnn$" in text
    assert cudnn == (attention_kernels.GPU_AUTO_BACKEND == "cudnn"), "auto compiled another kernel than it names"
    logits = np.asarray(auto.apply({"params": params}, src, tgt, **inputs), np.float32)
    real = np.asarray(tgt) != 0
    assert np.abs(logits[real] - reference[real]).max() <= 0.05 * np.abs(reference[real]).max()
