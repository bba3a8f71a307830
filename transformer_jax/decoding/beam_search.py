"""Beam search (paper section 6.1): N hypotheses per sentence, GNMT length penalty, early stopping.

The loop knows nothing of the model: it drives a `step_fn(tokens, state) -> (log_probs, state)`
(decoding/step.py) inside one jitted `jax.lax.while_loop` that stops as soon as no sentence can
improve. Hypothesis n of sentence b is row b*N + n of every per-hypothesis array (on the axis the
StepState names).

Shapes: B sentences, N beams, L output length, V vocabulary. Outputs exclude BOS and hold padding (0)
after EOS.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from transformer_jax.decoding.step import (
    NEG_INF,
    StepFn,
    StepState,
    cached_step,
    prefix_step,
    reorder_hypotheses,
)
from transformer_jax.decoding.lengths import length_penalty, output_lengths
from transformer_jax.decoding.options import check_search_settings, require
from transformer_jax.decoding.top_k import top_k_in_blocks
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID


class BeamSearchOutput(NamedTuple):
    """The n-best finished hypotheses per sentence, best first."""

    tokens_BxnxL: jax.Array
    scores_Bxn: jax.Array  # log P(Y) / lp(Y); -inf where a sentence has fewer hypotheses
    num_steps: jax.Array  # [] loop iterations run (early stopping ends it before L)


class _BeamState(NamedTuple):
    step: jax.Array  # [] tokens generated so far
    last_BNx1: jax.Array
    live_BxNxL: jax.Array
    live_log_probs_BxN: jax.Array
    finished_BxNxL: jax.Array
    finished_scores_BxN: jax.Array
    done_B: jax.Array
    model_state: StepState


def best_extensions(
    live_log_probs_BxN: jax.Array, log_probs_BNxV: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The k best one-token extensions of a sentence's N live hypotheses: log P, parent beam, token.

    One top-k over the [N*V] extensions (ties to the lower n*V + token), in the form each platform
    runs fastest, chosen when the search is compiled (`lax.platform_dependent`): on CPUs by
    blocks (`extensions_in_blocks`), elsewhere at once (`extensions_at_once`: on GPUs XLA's own
    top-k kernel, and none of the blocks' sorts).
    """
    return jax.lax.platform_dependent(
        live_log_probs_BxN, log_probs_BNxV, cpu=functools.partial(extensions_in_blocks, k=k),
        default=functools.partial(extensions_at_once, k=k))


def extensions_at_once(
    live_log_probs_BxN: jax.Array, log_probs_BNxV: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`best_extensions` as one top-k over each sentence's [N*V] extension scores."""
    batch, beams = live_log_probs_BxN.shape
    vocab = log_probs_BNxV.shape[-1]
    total_BxNV = (live_log_probs_BxN[:, :, None] + log_probs_BNxV.reshape(batch, beams, vocab)).reshape(batch, -1)
    best_Bxk, index_Bxk = jax.lax.top_k(total_BxNV, k)
    return best_Bxk, index_Bxk // vocab, index_Bxk % vocab


def extensions_in_blocks(
    live_log_probs_BxN: jax.Array, log_probs_BNxV: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`best_extensions` in two passes: a hypothesis' own k best tokens first (adding its log P to
    all of them keeps their order; `top_k_in_blocks`), then the k best of those N*k.

    Only a tie that the addition itself creates by rounding could be broken differently from one
    top-k, between two extensions of equal score.
    """
    batch, beams = live_log_probs_BxN.shape
    row_best_BNxk, row_token_BNxk = top_k_in_blocks(log_probs_BNxV, k)
    # Candidates of sentence b in beam-major order, so equal scores keep the order of n*V + token.
    total_BxNk = (live_log_probs_BxN[:, :, None] + row_best_BNxk.reshape(batch, beams, k)).reshape(batch, -1)
    best_Bxk, pick_Bxk = jax.lax.top_k(total_BxNk, k)
    token_Bxk = jnp.take_along_axis(row_token_BNxk.reshape(batch, -1), pick_Bxk, axis=1)
    return best_Bxk, pick_Bxk // k, token_Bxk


def _beam_step(
    step_fn: StepFn, carry: _BeamState, max_lengths_B: jax.Array, alpha: float | jax.Array,
    eos_id: int, num_returned: int,
) -> _BeamState:
    """Extends every live hypothesis by one token; sets aside those that end; keeps the N best live."""
    batch, beams, _ = carry.live_BxNxL.shape
    log_probs_BNxV, model_state = step_fn(carry.last_BNx1, carry.model_state)
    cand_log_probs_Bx2N, parent_Bx2N, token_Bx2N = best_extensions(
        carry.live_log_probs_BxN, log_probs_BNxV, 2 * beams)
    cand_Bx2NxL = jnp.take_along_axis(carry.live_BxNxL, parent_Bx2N[:, :, None], axis=1)
    cand_Bx2NxL = cand_Bx2NxL.at[:, :, carry.step].set(token_Bx2N)

    length = carry.step + 1
    at_max_B = length >= max_lengths_B
    # A candidate ends on EOS, or at the sentence's maximum length with all its tokens. Only the N
    # best may end (as in fairseq), which makes beam size 1 with alpha 0 exactly greedy.
    ends_Bx2N = ((token_Bx2N == eos_id) | at_max_B[:, None]) & (jnp.arange(2 * beams) < beams)
    new_scores_Bx2N = jnp.where(
        ends_Bx2N, cand_log_probs_Bx2N / length_penalty(length, alpha), NEG_INF)
    finished_scores_BxN, best = jax.lax.top_k(
        jnp.concatenate([carry.finished_scores_BxN, new_scores_Bx2N], axis=1), beams)
    finished_BxNxL = jnp.take_along_axis(
        jnp.concatenate([carry.finished_BxNxL, cand_Bx2NxL], axis=1), best[:, :, None], axis=1)

    live_scores_Bx2N = jnp.where(token_Bx2N == eos_id, NEG_INF, cand_log_probs_Bx2N)
    live_log_probs_BxN, keep_BxN = jax.lax.top_k(live_scores_Bx2N, beams)
    live_BxNxL = jnp.take_along_axis(cand_Bx2NxL, keep_BxN[:, :, None], axis=1)
    parent_BxN = jnp.take_along_axis(parent_Bx2N, keep_BxN, axis=1)
    rows_BN = (jnp.arange(batch)[:, None] * beams + parent_BxN).reshape(-1)
    model_state = model_state.replace(per_hypothesis=reorder_hypotheses(
        model_state.per_hypothesis, rows_BN, model_state.hypothesis_axis))

    # log P only falls and lp only grows, so no live hypothesis can score above this bound.
    best_possible_B = live_log_probs_BxN[:, 0] / length_penalty(max_lengths_B, alpha)
    cannot_improve_B = best_possible_B <= finished_scores_BxN[:, num_returned - 1]

    def unless_done(new: jax.Array, old: jax.Array) -> jax.Array:
        return jnp.where(carry.done_B.reshape((-1,) + (1,) * (new.ndim - 1)), old, new)

    return _BeamState(
        length,
        jnp.take_along_axis(token_Bx2N, keep_BxN, axis=1).reshape(-1, 1),
        unless_done(live_BxNxL, carry.live_BxNxL),
        unless_done(live_log_probs_BxN, carry.live_log_probs_BxN),
        unless_done(finished_BxNxL, carry.finished_BxNxL),
        unless_done(finished_scores_BxN, carry.finished_scores_BxN),
        carry.done_B | at_max_B | cannot_improve_B,
        model_state,
    )


def beam_search_loop(
    step_fn: StepFn, state: StepState, max_lengths_B: jax.Array, *, beam_size: int, output_length: int,
    alpha: float | jax.Array, num_returned: int = 1, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
) -> BeamSearchOutput:
    """Beam search over `step_fn`, batched over sentences; `state.per_hypothesis` has B*N rows."""
    batch = max_lengths_B.shape[0]
    # All beams start as the same BOS; only beam 0 is live, so the first step has no duplicates.
    first_log_probs_N = jnp.where(jnp.arange(beam_size) == 0, 0.0, NEG_INF)
    init = _BeamState(
        jnp.array(0, jnp.int32),
        jnp.full((batch * beam_size, 1), bos_id, jnp.int32),
        jnp.full((batch, beam_size, output_length), PAD_ID, jnp.int32),
        jnp.broadcast_to(first_log_probs_N, (batch, beam_size)),
        jnp.full((batch, beam_size, output_length), PAD_ID, jnp.int32),
        jnp.full((batch, beam_size), NEG_INF),
        jnp.zeros((batch,), bool),
        state,
    )
    body = functools.partial(
        _beam_step, step_fn, max_lengths_B=max_lengths_B, alpha=alpha, eos_id=eos_id,
        num_returned=num_returned,
    )

    def cond(carry: _BeamState) -> jax.Array:
        return (carry.step < output_length) & ~jnp.all(carry.done_B)

    final = jax.lax.while_loop(cond, body, init)
    return BeamSearchOutput(
        final.finished_BxNxL[:, :num_returned], final.finished_scores_BxN[:, :num_returned], final.step
    )


@functools.partial(
    jax.jit,
    static_argnames=("config", "beam_size", "max_extra_length", "num_returned", "use_cache", "eos_id"))
def _beam_search(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, alpha: jax.Array, *, beam_size: int,
    max_extra_length: int, num_returned: int, use_cache: bool, eos_id: int,
) -> BeamSearchOutput:
    """The n-best of a beam search with the cached or the full-prefix step."""
    max_lengths_B, output_length = output_lengths(config, src_tokens, max_extra_length)
    make_step = cached_step if use_cache else prefix_step
    step_fn, state = make_step(params, config, src_tokens, beam_size, output_length)
    return beam_search_loop(step_fn, state, max_lengths_B, beam_size=beam_size,
                            output_length=output_length, alpha=alpha, num_returned=num_returned,
                            eos_id=eos_id)


def beam_search(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, *, beam_size: int = 4,
    alpha: float = 0.6, max_extra_length: int = 50, num_returned: int = 1, use_cache: bool = True,
    eos_id: int = EOS_ID,
) -> tuple[jax.Array, jax.Array]:
    """[B, S] source ids -> the n-best ([B, n, L] ids, [B, n] scores log P / lp), best first."""
    check_search_settings(beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length)
    require(1 <= num_returned <= beam_size,
             f"num_returned={num_returned} must be in [1, beam_size={beam_size}]")
    require(2 * beam_size <= config.vocab_size,
             f"beam_size={beam_size} needs vocab_size >= {2 * beam_size}; use a smaller beam")
    output = _beam_search(params, config, jnp.asarray(src_tokens, jnp.int32), alpha,
                          beam_size=beam_size, max_extra_length=max_extra_length,
                          num_returned=num_returned, use_cache=use_cache, eos_id=eos_id)
    return output.tokens_BxnxL, output.scores_Bxn
