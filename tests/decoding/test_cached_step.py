"""The cached decoding step: equal to the full forward pass, its state split by kind, one encoder copy."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID
from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.step import cached_step, reorder_hypotheses
from transformer_jax.decoding.sampling import greedy_decode
from transformer_jax.model.attention_cache import history_chunks
from transformer_jax.model.stacks import scanned_layout


def test_cached_step_log_probs_equal_the_full_forward_pass_for_every_beam(model, full_forward_log_probs):
    params, config, src = model
    beams, length = 2, 6
    targets = jnp.asarray(np.random.default_rng(0).integers(4, 50, (src.shape[0] * beams, length)))
    tgt_in = jnp.concatenate([jnp.full((targets.shape[0], 1), BOS_ID), targets[:, :-1]], axis=1)

    @jax.jit
    def stepwise(params, src, tgt_in):
        step, state = cached_step(params, config, src, beams, length)
        return jax.lax.scan(lambda s, tokens: step(tokens[:, None], s)[::-1], state, tgt_in.T)[1]

    cached = np.asarray(stepwise(params, src, tgt_in)).transpose(1, 0, 2)
    full = full_forward_log_probs(params, config, jnp.repeat(src, beams, axis=0), tgt_in)
    real = np.isfinite(full)
    np.testing.assert_array_equal(np.isfinite(cached), real)
    np.testing.assert_allclose(cached[real], np.asarray(full)[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_only_the_beam_slot_table_is_per_hypothesis_and_the_caches_are_stored_by_slot(model, scan_layers):
    """Beam search reorders B*N*L integers per step, never the keys/values stored by beam slot."""
    params, config, src = model
    config = config.replace(scan_layers=scan_layers)
    params = scanned_layout(params) if scan_layers else params
    beams, length = 3, 5
    state = jax.eval_shape(lambda p: cached_step(p, config, src, beams, length)[1], params)
    assert state.hypothesis_axis == 0
    [table] = jax.tree.leaves(state.per_hypothesis)
    assert table.shape == (src.shape[0] * beams, length) and table.dtype == jnp.int32
    # A scanned stack holds one leaf per kind with a leading layer axis; a plain one, one per layer.
    layers, stacks = ((config.num_layers,), 1) if scan_layers else ((), config.num_layers)
    caches = jax.tree.leaves(state.shared["slot_cache"])
    assert len(caches) == 2 * stacks  # self-attention keys and values; no encoder keys/values
    # Keys [B, H, K, L*N] and values [B, H, L*N, K]: the layouts the attention dots read.
    batch, heads, head_dim = src.shape[0], config.num_heads, config.head_dim
    assert {x.shape for x in caches} == {layers + (batch, heads, head_dim, length * beams),
                                         layers + (batch, heads, length * beams, head_dim)}
    # Step counters: one per self-attention and the decoder's position.
    counters = jax.tree.leaves(state.shared["decode_step"])
    assert sorted(x.shape for x in counters) == sorted([()] + [layers] * stacks)


def test_a_hypothesis_reads_its_ancestors_keys_values_through_the_slot_table(model, full_forward_log_probs):
    """Hypotheses reordered between steps (swapped, one copied over another) match the full forward pass."""
    params, config, src = model
    beams, length = 2, 5
    rows = src.shape[0] * beams
    # After step t, row j continues row parents[t][j]: beams trade places, or beam 1 replaces beam 0.
    pairs = np.arange(rows).reshape(-1, 2)
    parents = np.stack([pairs[:, order].reshape(-1) for order in ([1, 0], [1, 1], [1, 0], [1, 1], [0, 1])])
    tokens_TxBN = np.random.default_rng(1).integers(4, 50, (length, rows))
    tokens_TxBN[0] = BOS_ID

    @jax.jit
    def stepwise(params, src, tokens_TxBN, parents_TxBN):
        step, state = cached_step(params, config, src, beams, length)

        def body(state, inputs):
            tokens_BN, parents_BN = inputs
            log_probs, state = step(tokens_BN[:, None], state)
            return state.replace(per_hypothesis=reorder_hypotheses(state.per_hypothesis, parents_BN, 0)), log_probs

        return jax.lax.scan(body, state, (tokens_TxBN, parents_TxBN))[1]

    cached_TxBNxV = np.asarray(stepwise(params, src, jnp.asarray(tokens_TxBN), jnp.asarray(parents)))
    # lineage[t, r]: the row at step t of the hypothesis that is row r at the last step.
    lineage = np.zeros((length, rows), int)
    lineage[-1] = np.arange(rows)
    for t in range(length - 2, -1, -1):
        lineage[t] = parents[t][lineage[t + 1]]
    assert len(set(lineage[0])) < rows  # some hypotheses share their beginnings
    tgt_in = jnp.asarray(np.take_along_axis(tokens_TxBN, lineage, axis=1).T)
    full = np.asarray(full_forward_log_probs(params, config, jnp.repeat(src, beams, axis=0), tgt_in))
    for t in range(length):
        mine_BNxV, expected_BNxV = cached_TxBNxV[t, lineage[t]], full[:, t]
        real = np.isfinite(expected_BNxV)
        np.testing.assert_array_equal(np.isfinite(mine_BNxV), real)
        np.testing.assert_allclose(mine_BNxV[real], expected_BNxV[real], atol=1e-5, rtol=1e-5)


def test_reorder_hypotheses_gathers_rows_of_the_given_axis():
    x_2x3 = jnp.array([[0, 1, 2], [10, 11, 12]])
    y_1x3x2 = jnp.arange(6).reshape(1, 3, 2)
    rows = jnp.array([2, 2, 0])
    reordered = reorder_hypotheses({"x": x_2x3, "y": [y_1x3x2]}, rows, axis=1)
    np.testing.assert_array_equal(reordered["x"], [[2, 2, 0], [12, 12, 10]])
    np.testing.assert_array_equal(reordered["y"][0], [[[4, 5], [4, 5], [0, 1]]])
    np.testing.assert_array_equal(reorder_hypotheses(x_2x3.T, rows, axis=0), [[2, 12], [2, 12], [0, 10]])


def test_greedy_with_cache_equals_greedy_by_repeated_full_forward(model, greedy_output):
    uncached = greedy_decode(*model, max_extra_length=6, use_cache=False)
    np.testing.assert_array_equal(greedy_output, uncached)
    assert np.any(greedy_output == EOS_ID)  # some sentences end before their maximum length


def test_beam_search_with_cache_equals_the_full_forward_reference(model, beam_output, beam_settings):
    tokens, scores = beam_search(*model, **beam_settings, use_cache=False)
    np.testing.assert_array_equal(beam_output[0], tokens)
    np.testing.assert_allclose(beam_output[1], scores, atol=1e-5, rtol=1e-5)


def test_scanned_layers_decode_the_same_beams(model, beam_output, beam_settings):
    """With scan_layers the cache has a leading layer axis; beams must still be reordered per hypothesis."""
    params, config, src = model
    tokens, scores = beam_search(scanned_layout(params), config.replace(scan_layers=True), src, **beam_settings)
    np.testing.assert_array_equal(beam_output[0], tokens)
    np.testing.assert_allclose(beam_output[1], scores, atol=1e-5, rtol=1e-5)


def test_beams_share_one_copy_of_the_encoder_keys_and_values(model, beam_settings):
    params, config, src = model
    batch, src_len = src.shape
    jaxpr = jax.make_jaxpr(lambda p: beam_search(p, config, src, **beam_settings))(params)
    shapes = set()

    def collect(jaxpr):
        for eqn in jaxpr.eqns:
            shapes.update(v.aval.shape for v in eqn.outvars if jnp.issubdtype(v.aval.dtype, jnp.floating))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                        collect(getattr(sub, "jaxpr", sub))

    collect(jaxpr.jaxpr)
    heads, head_dim = config.num_heads, config.head_dim
    assert (batch, src_len, heads, head_dim) in shapes  # the cross keys/values, once per sentence
    beams = beam_settings["beam_size"]
    assert not any(s[:2] == (batch * beams, src_len) for s in shapes)  # never per beam


@pytest.mark.parametrize("length, chunks", [(5, (5,)), (32, (32,)), (40, (40,)), (50, (32, 18)), (70, (32, 38)),
                                            (306, (32, 32, 64, 128, 50))])
def test_the_self_attention_cache_is_chunked_at_doubling_boundaries(length, chunks):
    assert history_chunks(length) == chunks


@pytest.fixture(scope="module")
def long_model() -> tuple[dict, TransformerConfig, jax.Array]:
    """A small Transformer whose outputs can be long enough to cross the cache's chunk boundaries."""
    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=128, positional_encoding="learned")
    src = jnp.asarray(np.random.default_rng(3).integers(4, 50, (3, 9)), jnp.int32)
    params = nn.meta.unbox(jax.jit(Transformer(config).init)(jax.random.key(1), src, src[:, :3])["params"])
    params = jax.tree.map(lambda x: 1.5 * x, params)
    # Large position embeddings make the next token depend on the position, so outputs vary.
    params["decoder"]["positional_encoding"]["position_embedding"] *= 10.0
    return params, config, src


@pytest.mark.parametrize("chunked", [True, False])
def test_steps_across_the_cache_chunks_equal_the_full_forward_pass(long_model, full_forward_log_probs, chunked):
    """Steps 0..99 write and read chunks of 32, 32 and 36 positions, or one of 100 (GPUs: no conditional)."""
    params, config, src = long_model
    config = config.replace(chunked_decoding_cache=chunked)
    beams, length = 2, 100
    tokens_TxBN = np.random.default_rng(4).integers(4, 50, (length, src.shape[0] * beams))
    tokens_TxBN[0] = BOS_ID

    @jax.jit
    def stepwise(params, src, tokens_TxBN):
        step, state = cached_step(params, config, src, beams, length)
        return jax.lax.scan(lambda s, t: step(t[:, None], s)[::-1], state, tokens_TxBN)[1]

    cached = np.asarray(stepwise(params, src, jnp.asarray(tokens_TxBN))).transpose(1, 0, 2)
    chunks = {x.shape[-1] for path, x in traverse_util.flatten_dict(
        jax.eval_shape(lambda p: cached_step(p, config, src, beams, length)[1], params).shared["slot_cache"]).items()
        if "key" in path[-1]}
    assert chunks == ({32 * beams, 36 * beams} if chunked else {100 * beams})
    hlo = jax.jit(lambda p, s, t: stepwise(p, s, t)).lower(params, src, jnp.asarray(tokens_TxBN)).as_text()
    assert ("stablehlo.case" in hlo or "stablehlo.if" in hlo) == chunked  # one chunk: no conditional at all
    full = np.asarray(full_forward_log_probs(params, config, jnp.repeat(src, beams, axis=0), jnp.asarray(tokens_TxBN.T)))
    real = np.isfinite(full)
    np.testing.assert_array_equal(np.isfinite(cached), real)
    np.testing.assert_allclose(cached[real], full[real], atol=2e-5, rtol=2e-5)


def test_a_step_reads_no_chunk_that_starts_after_its_position(long_model):
    """NaN keys/values in the chunks after a step's own are never read: the step's outputs stay finite."""
    params, config, src = long_model
    step, state = cached_step(params, config, src, 1, 100)
    flat = traverse_util.flatten_dict(state.shared["slot_cache"])
    # Keys [B, H, K, C] and values [B, H, C, K] of chunks of 32, 32 and 36 positions, in every layer.
    assert {path[-1]: x.shape[-1] for path, x in flat.items() if "key" in path[-1]} == {
        "cached_key_0": 32, "cached_key_1": 32, "cached_key_2": 36}
    poisoned = {path: jnp.full_like(x, jnp.nan) if not path[-1].endswith("_0") else x for path, x in flat.items()}
    state = state.replace(shared={**state.shared, "slot_cache": traverse_util.unflatten_dict(poisoned)})
    tokens = jnp.full((src.shape[0], 1), BOS_ID, jnp.int32)
    run = jax.jit(lambda s, n: jax.lax.scan(lambda s, _: step(tokens, s)[::-1], s, length=n), static_argnums=1)
    _, log_probs = run(state, 32)  # positions 0..31 read chunk 0 only
    assert np.isfinite(np.asarray(log_probs)[..., 4:]).all()
    _, log_probs = run(state, 33)  # position 32 reads chunk 1, which holds NaN in its unwritten slots
    assert np.isnan(np.asarray(log_probs)[-1]).all()


def test_one_hypothesis_a_sentence_keeps_the_chunks_without_chunked_decoding_cache(long_model):
    """Greedy and sampling (N = 1): XLA makes the chunks' conditionals selects, so GPUs keep them too."""
    params, config, src = long_model
    config = config.replace(chunked_decoding_cache=False)
    sizes = {beams: {x.shape[-1] for path, x in traverse_util.flatten_dict(jax.eval_shape(
        lambda p: cached_step(p, config, src, beams, 100)[1], params).shared["slot_cache"]).items() if "key" in path[-1]}
        for beams in (1, 2)}
    assert sizes == {1: {32, 36}, 2: {200}}
