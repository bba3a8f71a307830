"""The encoder-decoder Transformer: causality, padding invariance, sharing, sizes, caching, packing."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from transformer_jax import TokenEmbedding, Transformer, TransformerConfig
from transformer_jax.model import DECODING_COLLECTIONS


def init(config, src, tgt_in, seed=0):
    return Transformer(config).init(jax.random.key(seed), src, tgt_in)


def count_params(config: TransformerConfig) -> int:
    src = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), src, src))
    return sum(leaf.size for leaf in jax.tree.leaves(shapes["params"]))


def closed_form_count(vocab, n, d, d_ff):
    """Parameters implied by the paper's dimensions (biases on the Q, V, output projections and FFN,
    none on K, which the softmax would cancel; LayerNorm gain and bias; one shared embedding)."""
    attention = 4 * d * d + 3 * d
    ffn = d * d_ff + d_ff + d_ff * d + d
    encoder_layer = attention + ffn + 2 * 2 * d
    decoder_layer = 2 * attention + ffn + 3 * 2 * d
    return vocab * d + n * (encoder_layer + decoder_layer)


def test_parameter_counts_match_the_paper():
    base = count_params(TransformerConfig.preset("base", vocab_size=37000))
    big = count_params(TransformerConfig.preset("big", vocab_size=37000))
    print(f"\nparameters with a shared 37,000-token vocabulary: base {base:,}, big {big:,}")
    assert base == closed_form_count(37000, 6, 512, 2048) == 63_073_280
    assert big == closed_form_count(37000, 6, 1024, 4096) == 214_226_944
    assert abs(big / 213e6 - 1) < 0.02
    # The paper's "65M" for base is not reachable within 2% with a 37,000 vocabulary: the
    # architecture it describes has 63.07M (-2.96%); see docs/modules.md, "Model size against the paper".
    assert abs(base / 65e6 - 1) < 0.03


def test_causality_gradient_of_future_targets_is_zero(tiny_config, token_batch):
    src, _ = token_batch
    tgt_in = jnp.array([[2, 13, 14, 15, 16, 17, 18], [2, 19, 20, 21, 22, 23, 24]])
    params = init(tiny_config, src, tgt_in)
    delta = jnp.zeros(tgt_in.shape + (tiny_config.d_model,))

    def per_position_logit_sums(delta):
        def add_delta(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            is_target_lookup = (
                isinstance(context.module, TokenEmbedding)
                and context.method_name == "__call__"
                and args[0].shape == tgt_in.shape
            )
            return out + delta if is_target_lookup else out

        with nn.intercept_methods(add_delta):
            logits = Transformer(tiny_config).apply(params, src, tgt_in)
        return logits.sum(axis=(0, 2))  # [T]

    # jacobian[i, b, j, d] = d(sum of logits at position i) / d(target embedding at position j).
    jacobian = jax.jit(jax.jacrev(per_position_logit_sums))(delta)
    influence = np.abs(np.asarray(jacobian)).sum(axis=(1, 3))  # [i, j]
    future = np.triu(np.ones_like(influence, bool), k=1)
    assert np.all(influence[future] == 0.0), influence
    assert np.all(influence[~future] > 0.0), influence


def test_appending_source_padding_changes_no_logit(tiny_config, token_batch):
    src, tgt_in = token_batch
    params = init(tiny_config, src, tgt_in)
    apply = jax.jit(Transformer(tiny_config).apply)
    padded_src = jnp.pad(src, ((0, 0), (0, 5)))
    logits = apply(params, src, tgt_in)
    padded_logits = apply(params, padded_src, tgt_in)
    real = np.asarray(tgt_in != 0)
    assert np.max(np.abs(np.asarray(logits - padded_logits))[real]) <= 1e-5


def test_one_embedding_serves_source_target_and_output(tiny_config):
    src = jnp.array([[5, 6, 3]])  # ids 5, 6 only in the source
    tgt_in = jnp.array([[2, 7, 8]])  # ids 7, 8 only in the target input
    variables = init(tiny_config, src, tgt_in)
    tables = [path for path, _ in jax.tree_util.tree_leaves_with_path(variables["params"])
              if "embedding" in jax.tree_util.keystr(path)]
    assert len(tables) == 1
    model = Transformer(tiny_config)
    grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, src, tgt_in)[0, -1, 40]))(variables["params"])
    grad_rows = np.abs(np.asarray(nn.meta.unbox(grads)["shared_embedding"]["embedding"])).sum(-1)
    assert grad_rows[5] > 0 and grad_rows[6] > 0  # through the encoder input
    assert grad_rows[7] > 0 and grad_rows[8] > 0  # through the decoder input
    assert grad_rows[40] > 0  # through the pre-softmax projection only
    assert grad_rows[30] == 0  # a token used nowhere


def test_untied_embeddings_have_separate_tables(tiny_config, token_batch):
    config = tiny_config.replace(share_embeddings=False, tie_output_embedding=False)
    params = nn.meta.unbox(init(config, *token_batch)["params"])
    assert "shared_embedding" not in params
    assert params["encoder"]["embedding"]["embedding"].shape == (50, 64)
    assert params["decoder"]["embedding"]["embedding"].shape == (50, 64)
    assert params["decoder"]["output_projection"]["kernel"].shape == (64, 50)
    untied = count_params(config.replace(vocab_size=50))
    assert untied == count_params(tiny_config) + 2 * 50 * 64 + 50


def test_jit_and_eager_agree(tiny_config, token_batch):
    params = init(tiny_config, *token_batch)
    model = Transformer(tiny_config)
    eager = model.apply(params, *token_batch)
    jitted = jax.jit(model.apply)(params, *token_batch)
    np.testing.assert_allclose(eager, jitted, atol=1e-5, rtol=1e-5)


def test_bfloat16_compute_is_finite_and_close_to_float32(tiny_config, token_batch):
    params = init(tiny_config, *token_batch)
    full = jax.jit(Transformer(tiny_config).apply)(params, *token_batch)
    half = jax.jit(Transformer(tiny_config.replace(dtype="bfloat16")).apply)(params, *token_batch)
    assert half.dtype == jnp.float32  # logits stay float32
    assert np.all(np.isfinite(half))
    real = np.asarray(token_batch[1] != 0)
    assert np.max(np.abs(np.asarray(half - full))[real]) < 0.15 * np.max(np.abs(np.asarray(full)))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_cached_step_by_step_decoding_equals_full_forward(tiny_config, token_batch, norm_position):
    config = tiny_config.replace(norm_position=norm_position)
    src, _ = token_batch
    tgt_in = jnp.array([[2, 13, 14, 15, 16], [2, 17, 18, 19, 20]])
    params = init(config, src, tgt_in)["params"]
    full = Transformer(config).apply({"params": params}, src, tgt_in)

    model = Transformer(config, decoding=True)
    encoded = model.apply({"params": params}, src, method=Transformer.encode)
    # The call that creates the cache fixes its length and projects the encoder keys/values once.
    _, state = model.apply({"params": params}, encoded, src, jnp.ones_like(tgt_in),
                           method=Transformer.decode, mutable=DECODING_COLLECTIONS)
    # The beam slot table, the keys/values by slot, the encoder's keys/values and the step counters apart.
    (batch, length), kv = tgt_in.shape, (config.num_heads, config.head_dim)
    shapes = {"/".join(path): x.shape for path, x in traverse_util.flatten_dict(state).items()}
    for i in range(config.num_layers):
        layer = f"decoder/layer_{i}"
        # Keys/values by sentence, head and (position, beam slot) (one slot here), in the attention dots' layouts.
        assert shapes.pop(f"slot_cache/{layer}/self_attention/cached_key_0") == (batch, *kv, length)
        assert shapes.pop(f"slot_cache/{layer}/self_attention/cached_value_0") == (batch, kv[0], length, kv[1])
        assert shapes.pop(f"encoder_cache/{layer}/cross_attention/key") == (batch, *kv, src.shape[1])
        assert shapes.pop(f"encoder_cache/{layer}/cross_attention/value") == (batch, kv[0], src.shape[1], kv[1])
        assert shapes.pop(f"decode_step/{layer}/self_attention/cache_index") == ()
    assert shapes == {"decode_step/decoder/position": (), "cache/decoder/beam_slots": (batch, length)}
    steps = []
    for t in range(tgt_in.shape[1]):
        logits, state = model.apply({"params": params, **state}, encoded, src, tgt_in[:, t : t + 1],
                                    method=Transformer.decode, mutable=DECODING_COLLECTIONS)
        steps.append(logits[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_packed_segments_do_not_interact(tiny_config):
    config = tiny_config
    pair_a = (jnp.array([[5, 6, 3]]), jnp.array([[2, 7, 8]]))
    pair_b = (jnp.array([[9, 10, 11, 3]]), jnp.array([[2, 12]]))
    params = init(config, *pair_a)
    apply = jax.jit(Transformer(config).apply)
    packed_src = jnp.array([[5, 6, 3, 9, 10, 11, 3, 0]])
    packed_tgt = jnp.array([[2, 7, 8, 2, 12, 0]])
    logits = apply(
        params, packed_src, packed_tgt,
        src_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
        tgt_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
        src_segments=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
        tgt_segments=jnp.array([[1, 1, 1, 2, 2, 0]]),
    )
    np.testing.assert_allclose(logits[0, :3], apply(params, *pair_a)[0], atol=1e-5)
    np.testing.assert_allclose(logits[0, 3:5], apply(params, *pair_b)[0], atol=1e-5)


def test_post_ln_outputs_are_normalized_and_pre_ln_adds_final_norm(tiny_config, token_batch):
    src, _ = token_batch
    post = Transformer(tiny_config)
    post_params = post.init(jax.random.key(0), *token_batch)
    encoded = post.apply(post_params, src, method=Transformer.encode)
    np.testing.assert_allclose(encoded.mean(-1), 0.0, atol=1e-4)  # last op is a LayerNorm (gain 1)
    pre_params = nn.meta.unbox(init(tiny_config.replace(norm_position="pre"), *token_batch)["params"])
    assert "final_norm" in pre_params["encoder"] and "final_norm" in pre_params["decoder"]
    assert "final_norm" not in nn.meta.unbox(post_params["params"])["encoder"]


def test_dropout_is_active_only_when_not_deterministic(tiny_config, token_batch):
    params = init(tiny_config, *token_batch)
    apply = jax.jit(lambda key: Transformer(tiny_config).apply(
        params, *token_batch, deterministic=False, rngs={"dropout": key}))
    a, b, c = apply(jax.random.key(1)), apply(jax.random.key(2)), apply(jax.random.key(1))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, c)
