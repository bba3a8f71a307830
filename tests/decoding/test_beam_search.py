"""Beam search: the search loop on hand-checkable toy models, then on a Transformer."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.special_tokens import BOS_ID, EOS_ID
from transformer_jax.decoding.beam_search import (
    beam_search,
    beam_search_loop,
    best_extensions,
    extensions_at_once,
    extensions_in_blocks,
)
from transformer_jax.decoding.step import StepState
from transformer_jax.decoding.sampling import greedy_choice, token_loop
from transformer_jax.model.masks import PAD_ID

A, B, C, D = 4, 5, 6, 7  # toy tokens after pad, unk, bos, eos
TOY_VOCAB = 8


def trie_model(tree: dict[tuple[int, ...], dict[int, float]], sink: dict[int, float]):
    """A step_fn whose next-token distribution is tree[prefix] (sink for prefixes not listed).

    Its state is the node of each hypothesis' prefix, so a search that mixed up hypotheses would
    read the wrong distributions.
    """
    index = {prefix: node for node, prefix in enumerate(tree)}
    sink_node = len(tree)
    probs = np.zeros((sink_node + 1, TOY_VOCAB))
    next_node = np.full((sink_node + 1, TOY_VOCAB), sink_node)
    for prefix, node in index.items():
        probs[node, list(tree[prefix])] = list(tree[prefix].values())
        next_node[node] = [index.get(prefix + (token,), sink_node) for token in range(TOY_VOCAB)]
    probs[sink_node, list(sink)] = list(sink.values())
    assert np.allclose(probs.sum(-1), 1.0)
    next_node[index[()], BOS_ID] = index[()]
    log_probs_NxV, next_node = jnp.log(jnp.asarray(probs, jnp.float32)), jnp.asarray(next_node)

    def step(tokens_Bx1, state):
        node_B = next_node[state.per_hypothesis, tokens_Bx1[:, 0]]
        return log_probs_NxV[node_B], state.replace(per_hypothesis=node_B)

    return step


# Jitted once per step_fn, shapes and static settings; the toy tests reuse these compilations.
_beam_loop = jax.jit(beam_search_loop, static_argnums=0,
                     static_argnames=("beam_size", "output_length", "num_returned", "eos_id"))
_token_loop = jax.jit(token_loop, static_argnums=(0, 3, 4))


def toy_beam(step, max_lengths, *, beam_size, alpha, num_returned, output_length=10):
    max_lengths = jnp.asarray(max_lengths, jnp.int32)
    state = StepState(jnp.zeros((max_lengths.shape[0] * beam_size,), jnp.int32))  # all at the root
    tokens, scores, steps = _beam_loop(step, state, max_lengths, beam_size=beam_size, alpha=alpha,
                                       output_length=output_length, num_returned=num_returned)
    return np.asarray(tokens), np.asarray(scores), int(steps)


def toy_greedy(step, max_lengths, output_length=10):
    max_lengths = jnp.asarray(max_lengths, jnp.int32)
    state = StepState(jnp.zeros(max_lengths.shape, jnp.int32))
    tokens, steps = _token_loop(step, state, max_lengths, output_length, greedy_choice, jax.random.key(0))
    return np.asarray(tokens), int(steps)


def row(*tokens: int, width: int = 10) -> list[int]:
    return list(tokens) + [PAD_ID] * (width - len(tokens))


# Greedy takes A (0.5) then EOS (0.4): P = 0.20. Beam search finds B then EOS: P = 0.4 * 0.9 = 0.36.
GREEDY_TRAP = {
    (): {A: 0.5, B: 0.4, C: 0.1},
    (A,): {EOS_ID: 0.4, C: 0.35, B: 0.25},
    (B,): {EOS_ID: 0.9, C: 0.05, A: 0.05},
}
SINK = {EOS_ID: 0.5, C: 0.5}


def test_beam_search_finds_the_better_hypothesis_that_greedy_misses():
    step = trie_model(GREEDY_TRAP, SINK)
    greedy, greedy_steps = toy_greedy(step, [10])
    assert greedy.tolist() == [row(A, EOS_ID)] and greedy_steps == 2
    tokens, scores, steps = toy_beam(step, [10], beam_size=2, alpha=0.0, num_returned=2)
    assert tokens.tolist() == [[row(B, EOS_ID), row(A, EOS_ID)]]
    np.testing.assert_allclose(scores, [[math.log(0.36), math.log(0.2)]], rtol=1e-6)
    # After step 2 the best live hypothesis (A C, P = 0.175) cannot beat the finished ones.
    assert steps == 2


# EOS is second best at the first step (P = 0.4) and beats greedy's A B EOS (P = 0.3): beam size 1
# must still not keep it, because only the N best extensions of a step may end.
EOS_SECOND = {(): {A: 0.5, EOS_ID: 0.4, C: 0.1}, (A,): {B: 0.6, EOS_ID: 0.4}, (A, B): {EOS_ID: 1.0}}


@pytest.mark.parametrize("tree, greedy_prob", [(GREEDY_TRAP, 0.5 * 0.4), (EOS_SECOND, 0.5 * 0.6)],
                         ids=["greedy_trap", "eos_second"])
def test_beam_size_one_without_length_penalty_is_greedy_on_a_toy_model(tree, greedy_prob):
    step = trie_model(tree, SINK)
    greedy, _ = toy_greedy(step, [10])
    tokens, scores, _ = toy_beam(step, [10], beam_size=1, alpha=0.0, num_returned=1)
    assert tokens[:, 0].tolist() == greedy.tolist()
    np.testing.assert_allclose(scores, [[math.log(greedy_prob)]], rtol=1e-6)


# Three complete hypotheses: [EOS] (log P = log(1 - e^-1 - e^-1.2)), [A EOS] (-1), [B C D EOS] (-1.2).
LENGTHS = {
    (): {A: math.exp(-1.0), B: math.exp(-1.2), EOS_ID: 1 - math.exp(-1.0) - math.exp(-1.2)},
    (A,): {EOS_ID: 1.0},
    (B,): {C: 1.0},
    (B, C): {D: 1.0},
    (B, C, D): {EOS_ID: 1.0},
}
LENGTHS_MODEL = trie_model(LENGTHS, SINK)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_length_penalty_ranks_hypotheses_by_log_prob_over_lp(alpha):
    candidates = {(EOS_ID,): math.log(LENGTHS[()][EOS_ID]), (A, EOS_ID): -1.0, (B, C, D, EOS_ID): -1.2}
    expected = sorted(
        ((log_p / ((5 + len(y)) / 6) ** alpha, y) for y, log_p in candidates.items()), reverse=True)
    tokens, scores, _ = toy_beam(LENGTHS_MODEL, [10], beam_size=3, alpha=alpha, num_returned=3)
    assert tokens[0].tolist() == [row(*y) for _, y in expected]
    np.testing.assert_allclose(scores[0], [s for s, _ in expected], rtol=1e-5)
    # The formula puts the crossover of the short and the long hypothesis at alpha = 0.725.
    winner = tokens[0, 0, :4].tolist()
    assert winner == ([B, C, D, EOS_ID] if alpha > 0.725 else [A, EOS_ID, PAD_ID, PAD_ID])


def test_search_continues_while_a_longer_hypothesis_can_still_win_under_the_penalty():
    # After step 2, [A EOS] scores -1 / lp(2) = -0.857 and the live B C has -1.2 / lp(2) = -1.03, but
    # it may still end longer: bounded by -1.2 / lp(10) = -0.48. It does: [B C D EOS] scores -0.8.
    tokens, scores, steps = toy_beam(LENGTHS_MODEL, [10], beam_size=2, alpha=1.0, num_returned=1)
    assert tokens[0, 0].tolist() == row(B, C, D, EOS_ID)
    np.testing.assert_allclose(scores, [[-1.2 / 1.5]], rtol=1e-5)
    # Then no live hypothesis has a finite log-probability left, and the bound stops the search.
    assert steps == 4


# After EOS this model would continue with B for sure: a search that extended finished hypotheses
# would show it after the EOS, and change their scores.
AFTER_EOS = {
    (): {A: 0.6, EOS_ID: 0.3, C: 0.1},
    (EOS_ID,): {B: 1.0},
    (A,): {EOS_ID: 0.7, C: 0.3},
    (A, EOS_ID): {B: 1.0},
}


def test_finished_hypotheses_are_never_extended_and_padding_follows_eos():
    step = trie_model(AFTER_EOS, {C: 1.0})
    tokens, scores, _ = toy_beam(step, [6], beam_size=3, alpha=0.0, num_returned=3)
    assert tokens[0].tolist() == [row(A, EOS_ID), row(EOS_ID), row(A, C, C, C, C, C)]
    np.testing.assert_allclose(scores[0], np.log([0.42, 0.3, 0.18]), rtol=1e-6)
    greedy, _ = toy_greedy(step, [6])
    assert greedy.tolist() == [row(A, EOS_ID)]


def test_hypotheses_without_eos_keep_their_whole_length_up_to_each_sentence_maximum():
    step = trie_model({(): {A: 0.6, C: 0.4}}, {A: 0.6, C: 0.4})  # never emits EOS
    tokens, scores, steps = toy_beam(step, [3, 5], beam_size=2, alpha=0.6, num_returned=2)
    assert tokens[:, 0].tolist() == [row(A, A, A), row(A, A, A, A, A)]
    assert [np.count_nonzero(t) for t in tokens.reshape(4, -1)] == [3, 3, 5, 5]
    for sentence, length in enumerate([3, 5]):
        best = length * math.log(0.6) / ((5 + length) / 6) ** 0.6
        second = ((length - 1) * math.log(0.6) + math.log(0.4)) / ((5 + length) / 6) ** 0.6
        np.testing.assert_allclose(scores[sentence], [best, second], rtol=1e-5)
    assert steps == 5
    greedy, greedy_steps = toy_greedy(step, [3, 5])
    assert greedy.tolist() == [row(A, A, A), row(A, A, A, A, A)] and greedy_steps == 5


def test_toy_search_of_a_batch_equals_each_sentence_alone():
    step = trie_model(AFTER_EOS, {C: 0.7, EOS_ID: 0.3})
    together = toy_beam(step, [2, 6, 4], beam_size=2, alpha=0.6, num_returned=2)
    for i, length in enumerate([2, 6, 4]):
        alone = toy_beam(step, [length], beam_size=2, alpha=0.6, num_returned=2)
        assert together[0][i].tolist() == alone[0][0].tolist()
        np.testing.assert_allclose(together[1][i], alone[1][0], rtol=1e-6)


# ---- The Transformer (fixtures in conftest.py) ----


def test_beam_scores_are_full_forward_log_probs_over_the_length_penalty(
        model, beam_output, full_forward_log_probs):
    params, config, src = model
    tokens, scores = beam_output
    flat = jnp.asarray(tokens.reshape(-1, tokens.shape[-1]))
    tgt_in = jnp.concatenate([jnp.full((flat.shape[0], 1), BOS_ID), flat[:, :-1]], axis=1)
    log_probs = full_forward_log_probs(params, config, jnp.repeat(src, 3, axis=0), tgt_in)
    token_log_probs = jnp.take_along_axis(log_probs, flat[..., None], axis=-1)[..., 0]
    lengths = np.count_nonzero(tokens, axis=-1)
    log_p = np.asarray(jnp.where(flat != PAD_ID, token_log_probs, 0.0).sum(-1)).reshape(lengths.shape)
    np.testing.assert_allclose(scores, log_p / ((5 + lengths) / 6) ** 0.6, atol=1e-5, rtol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first


def test_beam_size_one_without_length_penalty_is_greedy(model, greedy_output):
    tokens, _ = beam_search(*model, beam_size=1, alpha=0.0, max_extra_length=6)
    np.testing.assert_array_equal(np.asarray(tokens)[:, 0], greedy_output)


def test_a_batch_decodes_as_each_sentence_alone(model, beam_output, beam_settings):
    params, config, src = model
    for i in (1, 2):  # the padded sentences (of one length, so one compilation serves both)
        sentence = np.asarray(src[i])
        alone = sentence[: np.count_nonzero(sentence)][None]  # without the batch's padding
        tokens, scores = beam_search(params, config, alone, **beam_settings)
        width = tokens.shape[-1]
        np.testing.assert_array_equal(beam_output[0][i, :, :width], tokens[0])
        assert np.all(beam_output[0][i, :, width:] == PAD_ID)
        np.testing.assert_allclose(beam_output[1][i], scores[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("extensions", [best_extensions, extensions_in_blocks, extensions_at_once])
def test_best_extensions_equal_one_top_k_over_every_extension(extensions):
    rng = np.random.default_rng(1)
    batch, beams, vocab = 6, 4, 500
    live_BxN = jnp.asarray(np.round(rng.normal(size=(batch, beams)) * 4) / 4 - 3, jnp.float32)
    log_probs_BNxV = jnp.asarray(np.round(rng.normal(size=(batch * beams, vocab)) * 4) / 4, jnp.float32)
    log_probs_BNxV = log_probs_BNxV.at[:, :3].set(-jnp.inf)
    best, parent, token = jax.jit(extensions, static_argnums=2)(live_BxN, log_probs_BNxV, 2 * beams)
    total_BxNV = (live_BxN[:, :, None] + log_probs_BNxV.reshape(batch, beams, vocab)).reshape(batch, -1)
    expected_best, expected_index = jax.lax.top_k(total_BxNV, 2 * beams)
    np.testing.assert_array_equal(best, expected_best)
    np.testing.assert_array_equal(parent, expected_index // vocab)
    np.testing.assert_array_equal(token, expected_index % vocab)


def test_greedy_choice_is_the_first_argmax():
    x_BxV = jnp.asarray(np.round(np.random.default_rng(2).normal(size=(64, 300))), jnp.float32)
    x_BxV = x_BxV.at[0].set(1.0).at[1, 7].set(9.0).at[1, 200].set(9.0)
    chosen = greedy_choice(x_BxV, jax.random.key(0))
    np.testing.assert_array_equal(chosen, jnp.argmax(x_BxV, axis=-1))
    assert chosen[0] == 0 and chosen[1] == 7
