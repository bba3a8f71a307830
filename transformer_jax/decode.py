"""Decoding: greedy, sampling (temperature, top-k, top-p) and beam search, with a key/value cache.

The search loops know nothing of the model: each drives a `step_fn(tokens_Bx1, state) ->
(log_probs_BxV, state)` inside one jitted `jax.lax.while_loop` that stops as soon as every sentence
has finished. Every leaf of `state` with a leading axis has one row per hypothesis (B*N rows, beam n
of sentence b at row b*N + n) and is reordered with its hypothesis; 0-d leaves (step counters) are
shared. Two Transformer steps plug into them: `cached_step`, one position per call against the
decoder's cache, and `prefix_step`, which reruns the full forward pass on the whole prefix (the
reference the cached step is tested and benchmarked against).

Shapes: B sentences, N beams, L output length, S source length, V vocabulary. Outputs exclude BOS
and hold padding (0) after EOS. PAD and BOS are never generated.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer_jax.config import TransformerConfig
from transformer_jax.masks import PAD_ID
from transformer_jax.model import Transformer

BOS_ID = 2
EOS_ID = 3
NEG_INF = -jnp.inf
StepFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]
ChooseFn = Callable[[jax.Array, jax.Array], jax.Array]


def length_penalty(length: jax.Array, alpha: float | jax.Array) -> jax.Array:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting EOS; a hypothesis scores log P(Y) / lp(Y)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def max_output_lengths(src_tokens: jax.Array, max_extra_length: int, max_len: int) -> jax.Array:
    """[B] longest output per sentence: its non-pad source tokens + max_extra_length, at most max_len."""
    source_lengths_B = jnp.sum(src_tokens != PAD_ID, axis=-1, dtype=jnp.int32)
    return jnp.minimum(source_lengths_B + max_extra_length, max_len)


def filter_logits(
    logits_BxV: jax.Array, temperature: float | jax.Array, top_k: int = 0, top_p: float | jax.Array = 1.0
) -> jax.Array:
    """Logits / temperature, with -inf outside the top_k tokens (0 = all) and the top_p nucleus."""
    logits_BxV = logits_BxV / temperature
    if top_k > 0:
        kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
        logits_BxV = jnp.where(logits_BxV < kth_Bx1, NEG_INF, logits_BxV)
    sorted_BxV = -jnp.sort(-logits_BxV, axis=-1)
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    # The nucleus is the shortest prefix of the sorted tokens whose mass reaches top_p.
    kept_BxV = (jnp.cumsum(probs_BxV, axis=-1) - probs_BxV) < top_p
    threshold_Bx1 = jnp.min(jnp.where(kept_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
    nucleus_BxV = jnp.where(logits_BxV < threshold_Bx1, NEG_INF, logits_BxV)
    return jnp.where(top_p >= 1.0, logits_BxV, nucleus_BxV)


def greedy_choice(log_probs_BxV: jax.Array, key: jax.Array) -> jax.Array:
    """The most probable token of each row, [B] (the key is unused)."""
    del key
    return jnp.argmax(log_probs_BxV, axis=-1)


def sampling_choice(
    temperature: float | jax.Array = 1.0, top_k: int = 0, top_p: float | jax.Array = 1.0
) -> ChooseFn:
    """A choose_fn drawing each row's token from softmax(filter_logits(log_probs, ...))."""

    def choose(log_probs_BxV: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, filter_logits(log_probs_BxV, temperature, top_k, top_p))

    return choose


class _TokenState(NamedTuple):
    step: jax.Array  # [] tokens generated so far
    last_Bx1: jax.Array
    tokens_BxL: jax.Array
    finished_B: jax.Array
    model_state: Any


def token_loop(
    step_fn: StepFn, state: Any, max_lengths_B: jax.Array, output_length: int, choose_fn: ChooseFn,
    rng: jax.Array, *, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
) -> tuple[jax.Array, jax.Array]:
    """One token per sentence and step, picked by `choose_fn`; returns ([B, L] tokens, steps run)."""
    batch = max_lengths_B.shape[0]

    def body(carry: _TokenState) -> _TokenState:
        log_probs_BxV, model_state = step_fn(carry.last_Bx1, carry.model_state)
        token_B = choose_fn(log_probs_BxV, jax.random.fold_in(rng, carry.step)).astype(jnp.int32)
        token_B = jnp.where(carry.finished_B, PAD_ID, token_B)
        finished_B = carry.finished_B | (token_B == eos_id) | (carry.step + 1 >= max_lengths_B)
        tokens_BxL = carry.tokens_BxL.at[:, carry.step].set(token_B)
        return _TokenState(carry.step + 1, token_B[:, None], tokens_BxL, finished_B, model_state)

    def cond(carry: _TokenState) -> jax.Array:
        return (carry.step < output_length) & ~jnp.all(carry.finished_B)

    init = _TokenState(
        jnp.array(0, jnp.int32), jnp.full((batch, 1), bos_id, jnp.int32),
        jnp.full((batch, output_length), PAD_ID, jnp.int32), jnp.zeros((batch,), bool), state,
    )
    final = jax.lax.while_loop(cond, body, init)
    return final.tokens_BxL, final.step


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
    model_state: Any


def _hypothesis_axis(path: tuple[Any, ...]) -> int:
    """Leaves of a scanned layer stack (module `layers`) carry the layer axis first, hypotheses second."""
    return 1 if any(getattr(key, "key", None) == "layers" for key in path) else 0


def _reorder_hypotheses(state: Any, rows_BN: jax.Array) -> Any:
    """Gathers row `rows_BN[i]` of every leaf's hypothesis axis into row i.

    The hypothesis axis is the leading one, or the second in a scanned stack; leaves without it (step
    counters, per-layer counters) are kept as they are.
    """

    def reorder(path: tuple[Any, ...], x: jax.Array) -> jax.Array:
        axis = _hypothesis_axis(path)
        return jnp.take(x, rows_BN, axis=axis) if x.ndim > axis else x

    return jax.tree_util.tree_map_with_path(reorder, state)


def _beam_step(
    step_fn: StepFn, carry: _BeamState, max_lengths_B: jax.Array, alpha: float | jax.Array,
    eos_id: int, num_returned: int,
) -> _BeamState:
    """Extends every live hypothesis by one token; sets aside those that end; keeps the N best live."""
    batch, beams, _ = carry.live_BxNxL.shape
    log_probs_BNxV, model_state = step_fn(carry.last_BNx1, carry.model_state)
    vocab = log_probs_BNxV.shape[-1]
    # Every one-token extension of every live hypothesis, [B, N*V] per sentence.
    total_BxNxV = carry.live_log_probs_BxN[:, :, None] + log_probs_BNxV.reshape(batch, beams, vocab)
    # Each parent has one EOS extension, so 2N candidates always hold N that do not end.
    cand_log_probs_Bx2N, cand_index_Bx2N = jax.lax.top_k(total_BxNxV.reshape(batch, -1), 2 * beams)
    parent_Bx2N, token_Bx2N = cand_index_Bx2N // vocab, cand_index_Bx2N % vocab
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
    model_state = _reorder_hypotheses(model_state, rows_BN)

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
    step_fn: StepFn, state: Any, max_lengths_B: jax.Array, *, beam_size: int, output_length: int,
    alpha: float | jax.Array, num_returned: int = 1, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
) -> BeamSearchOutput:
    """Beam search over `step_fn`, batched over sentences; `state` leaves lead with B*N rows."""
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


def _allowed_log_probs(logits_BxV: jax.Array) -> jax.Array:
    """log_softmax over the tokens a decoder may emit (never PAD or BOS)."""
    token_ids_V = jnp.arange(logits_BxV.shape[-1])
    allowed_V = (token_ids_V != PAD_ID) & (token_ids_V != BOS_ID)
    return jax.nn.log_softmax(jnp.where(allowed_V, logits_BxV.astype(jnp.float32), NEG_INF), axis=-1)


def _is_shared(path: tuple[str, ...]) -> bool:
    return path[-1] in ("cross_key", "cross_value")


def cached_step(
    params: Any, config: TransformerConfig, src_tokens_BxS: jax.Array, beam_size: int, output_length: int
) -> tuple[StepFn, Any]:
    """The Transformer's one-position step against its key/value cache, and its initial state.

    The encoder runs once; each layer's encoder-decoder keys/values are projected once, kept at
    [B, S, H, K] outside the per-hypothesis state and shared by the N beams of a sentence (the
    attention folds beams into its query axis). The state holds the self-attention caches
    [B*N, L, H, K] and the step counters.
    """
    model = Transformer(config, decoding=True)
    encoded_BxSxD = model.apply({"params": params}, src_tokens_BxS, method=Transformer.encode)
    # Only the ids repeat per beam (for the cross-attention padding mask), not the encoder output.
    src_BNxS = jnp.repeat(src_tokens_BxS, beam_size, axis=0)
    dummy_BNxL = jnp.ones((src_BNxS.shape[0], output_length), jnp.int32)
    # Creates the cache; its logits are unused, so XLA drops that forward pass.
    _, variables = model.apply({"params": params}, encoded_BxSxD, src_BNxS, dummy_BNxL,
                               method=Transformer.decode, mutable=["cache"])
    flat = traverse_util.flatten_dict(variables["cache"])
    shared = {path: leaf for path, leaf in flat.items() if _is_shared(path)}

    def split(cache: Any) -> Any:
        flat_cache = traverse_util.flatten_dict(cache)
        return traverse_util.unflatten_dict({p: x for p, x in flat_cache.items() if not _is_shared(p)})

    def step(tokens_BNx1: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        cache = traverse_util.unflatten_dict({**shared, **traverse_util.flatten_dict(state)})
        logits_BNx1xV, variables = model.apply(
            {"params": params, "cache": cache}, encoded_BxSxD, src_BNxS, tokens_BNx1,
            method=Transformer.decode, mutable=["cache"])
        return _allowed_log_probs(logits_BNx1xV[:, 0]), split(variables["cache"])

    return step, split(variables["cache"])


def prefix_step(
    params: Any, config: TransformerConfig, src_tokens_BxS: jax.Array, beam_size: int, output_length: int
) -> tuple[StepFn, Any]:
    """A step without a cache: `Transformer.__call__` on the whole prefix padded to L, every step."""
    model = Transformer(config)
    src_BNxS = jnp.repeat(src_tokens_BxS, beam_size, axis=0)

    def step(tokens_BNx1: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        position = state["step"]
        prefix_BNxL = jax.lax.dynamic_update_slice_in_dim(
            state["prefix"], tokens_BNx1, position, axis=1)
        logits_BNxLxV = model.apply({"params": params}, src_BNxS, prefix_BNxL)
        logits_BNxV = jax.lax.dynamic_index_in_dim(logits_BNxLxV, position, axis=1, keepdims=False)
        return _allowed_log_probs(logits_BNxV), {"prefix": prefix_BNxL, "step": position + 1}

    prefix_BNxL = jnp.full((src_BNxS.shape[0], output_length), PAD_ID, jnp.int32)
    return step, {"prefix": prefix_BNxL, "step": jnp.array(0, jnp.int32)}


def _lengths(
    config: TransformerConfig, src_tokens: jax.Array, max_extra_length: int
) -> tuple[jax.Array, int]:
    """Per-sentence maximum output lengths [B] and the output width L (static)."""
    output_length = min(src_tokens.shape[1] + max_extra_length, config.max_len)
    return max_output_lengths(src_tokens, max_extra_length, config.max_len), output_length


@functools.partial(
    jax.jit, static_argnames=("config", "top_k", "greedy", "max_extra_length", "use_cache", "eos_id"))
def _token_by_token(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, rng: jax.Array,
    temperature: jax.Array, top_p: jax.Array, *, top_k: int, greedy: bool, max_extra_length: int,
    use_cache: bool, eos_id: int,
) -> jax.Array:
    """Greedy or sampled [B, L] outputs (one hypothesis per sentence)."""
    max_lengths_B, output_length = _lengths(config, src_tokens, max_extra_length)
    make_step = cached_step if use_cache else prefix_step
    step_fn, state = make_step(params, config, src_tokens, 1, output_length)
    choose = greedy_choice if greedy else sampling_choice(temperature, top_k, top_p)
    return token_loop(step_fn, state, max_lengths_B, output_length, choose, rng, eos_id=eos_id)[0]


@functools.partial(
    jax.jit,
    static_argnames=("config", "beam_size", "max_extra_length", "num_returned", "use_cache", "eos_id"))
def _beam_search(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, alpha: jax.Array, *, beam_size: int,
    max_extra_length: int, num_returned: int, use_cache: bool, eos_id: int,
) -> BeamSearchOutput:
    """The n-best of a beam search with the cached or the full-prefix step."""
    max_lengths_B, output_length = _lengths(config, src_tokens, max_extra_length)
    make_step = cached_step if use_cache else prefix_step
    step_fn, state = make_step(params, config, src_tokens, beam_size, output_length)
    return beam_search_loop(step_fn, state, max_lengths_B, beam_size=beam_size,
                            output_length=output_length, alpha=alpha, num_returned=num_returned,
                            eos_id=eos_id)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_number(value: Any) -> bool:
    """True for a Python number; traced values (decoding inside a caller's jit) are not checked."""
    return isinstance(value, (int, float))


def greedy_decode(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, *, max_extra_length: int = 50,
    use_cache: bool = True, eos_id: int = EOS_ID,
) -> jax.Array:
    """[B, S] source ids -> [B, L] greedy output ids (L = min(S + max_extra_length, config.max_len))."""
    _require(max_extra_length >= 1, f"max_extra_length={max_extra_length} must be at least 1")
    return _token_by_token(params, config, jnp.asarray(src_tokens, jnp.int32), jax.random.key(0),
                           1.0, 1.0, top_k=0, greedy=True, max_extra_length=max_extra_length,
                           use_cache=use_cache, eos_id=eos_id)


def sample_decode(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, rng: jax.Array, *,
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, max_extra_length: int = 50,
    eos_id: int = EOS_ID,
) -> jax.Array:
    """[B, S] source ids -> [B, L] ids sampled from softmax(logits / temperature), top-k/top-p filtered."""
    _require(not _is_number(temperature) or temperature > 0, f"temperature={temperature} must be positive (greedy_decode takes the argmax)")
    _require(0 <= top_k <= config.vocab_size,
             f"top_k={top_k} must be in [0, vocab_size={config.vocab_size}] (0 keeps every token)")
    _require(not _is_number(top_p) or 0 < top_p <= 1, f"top_p={top_p} must be in (0, 1] (1 keeps every token)")
    _require(max_extra_length >= 1, f"max_extra_length={max_extra_length} must be at least 1")
    return _token_by_token(params, config, jnp.asarray(src_tokens, jnp.int32), rng, temperature, top_p,
                           top_k=top_k, greedy=False, max_extra_length=max_extra_length, use_cache=True,
                           eos_id=eos_id)


def beam_search(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, *, beam_size: int = 4,
    alpha: float = 0.6, max_extra_length: int = 50, num_returned: int = 1, use_cache: bool = True,
    eos_id: int = EOS_ID,
) -> tuple[jax.Array, jax.Array]:
    """[B, S] source ids -> the n-best ([B, n, L] ids, [B, n] scores log P / lp), best first."""
    _require(beam_size >= 1, f"beam_size={beam_size} must be at least 1")
    _require(1 <= num_returned <= beam_size,
             f"num_returned={num_returned} must be in [1, beam_size={beam_size}]")
    _require(not _is_number(alpha) or alpha >= 0, f"alpha={alpha} must be >= 0 (0 turns the length penalty off)")
    _require(max_extra_length >= 1, f"max_extra_length={max_extra_length} must be at least 1")
    _require(2 * beam_size <= config.vocab_size,
             f"beam_size={beam_size} needs vocab_size >= {2 * beam_size}; use a smaller beam")
    output = _beam_search(params, config, jnp.asarray(src_tokens, jnp.int32), alpha,
                          beam_size=beam_size, max_extra_length=max_extra_length,
                          num_returned=num_returned, use_cache=use_cache, eos_id=eos_id)
    return output.tokens_BxnxL, output.scores_Bxn


def translate_batch(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, *, mode: str = "beam",
    rng: jax.Array | None = None, **options: Any,
) -> jax.Array:
    """[B, S] source ids -> [B, L] output ids by "beam" (the best), "greedy" or "sample" decoding."""
    if mode == "beam":
        return beam_search(params, config, src_tokens, **options)[0][:, 0]
    if mode == "greedy":
        return greedy_decode(params, config, src_tokens, **options)
    if mode == "sample":
        _require(rng is not None, 'mode="sample" needs rng=jax.random.key(seed)')
        return sample_decode(params, config, src_tokens, rng, **options)
    raise ValueError(f'mode={mode!r} is not one of ["beam", "greedy", "sample"]')
