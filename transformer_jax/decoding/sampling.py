"""Greedy decoding and sampling (temperature, top-k, top-p): one token per sentence and step."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from transformer_jax.decoding.step import (
    NEG_INF,
    StepFn,
    cached_step,
    prefix_step,
)
from transformer_jax.decoding.lengths import output_lengths
from transformer_jax.decoding.options import check_search_settings, require
from transformer_jax.decoding.top_k import top_k_in_blocks
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID

ChooseFn = Callable[[jax.Array, jax.Array], jax.Array]


def filter_logits(
    logits_BxV: jax.Array, temperature: float | jax.Array, top_k: int = 0, top_p: float | jax.Array = 1.0
) -> jax.Array:
    """Logits / temperature, with -inf outside the top_k tokens (0 = all) and the top_p nucleus."""
    # Each row's best token at 0 before dividing: no temperature overflows the others past -inf into NaN.
    logits_BxV = (logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True)) / temperature
    if top_k > 0:
        kth_Bx1 = top_k_in_blocks(logits_BxV, top_k)[0][:, -1:]
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
    # jnp.argmax's (value, index) reduction runs ~3x slower on CPU than two plain reductions: the
    # maximum, then the first index holding it (the same token, ties to the lower index).
    best_Bx1 = jnp.max(log_probs_BxV, axis=-1, keepdims=True)
    vocab = log_probs_BxV.shape[-1]
    token_ids_V = jnp.arange(vocab, dtype=jnp.int32)
    return jnp.min(jnp.where(log_probs_BxV == best_Bx1, token_ids_V, vocab - 1), axis=-1)


def sampling_choice(
    temperature: float | jax.Array = 1.0, top_k: int = 0, top_p: float | jax.Array = 1.0
) -> ChooseFn:
    """A choose_fn drawing each row's token from softmax(filter_logits(log_probs, ...)), from one key for the
    batch or from each row's own key ([B] keys)."""

    def choose(log_probs_BxV: jax.Array, key: jax.Array) -> jax.Array:
        filtered_BxV = filter_logits(log_probs_BxV, temperature, top_k, top_p)
        if key.ndim == 0:
            return jax.random.categorical(key, filtered_BxV)
        return jax.vmap(jax.random.categorical)(key, filtered_BxV)

    return choose


class _TokenState(NamedTuple):
    step: jax.Array  # [] tokens generated so far
    last_Bx1: jax.Array
    tokens_BxL: jax.Array
    finished_B: jax.Array
    model_state: Any


def row_keys(rng: jax.Array, row_ids_B: jax.Array) -> jax.Array:
    """[B] keys, one per row: `rng` folded with each row's id. A row's draws then depend on its id alone, not on
    its place in a batch or the device that decodes it."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, jnp.asarray(row_ids_B, jnp.uint32))


def token_loop(
    step_fn: StepFn, state: Any, max_lengths_B: jax.Array, output_length: int, choose_fn: ChooseFn,
    rng: jax.Array, *, bos_id: int = BOS_ID, eos_id: int = EOS_ID, row_ids_B: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One token per sentence and step, picked by `choose_fn`; returns ([B, L] tokens, steps run).

    `choose_fn` gets each row's key for the step: `rng` folded with the row's id (`row_ids_B`, default its place
    in the batch), then with the step."""
    batch = max_lengths_B.shape[0]
    keys_B = row_keys(rng, jnp.arange(batch) if row_ids_B is None else row_ids_B)

    def body(carry: _TokenState) -> _TokenState:
        log_probs_BxV, model_state = step_fn(carry.last_Bx1, carry.model_state)
        step_keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_B, carry.step)
        token_B = choose_fn(log_probs_BxV, step_keys_B).astype(jnp.int32)
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


@functools.partial(
    jax.jit, static_argnames=("config", "top_k", "greedy", "max_extra_length", "use_cache", "eos_id"))
def _token_by_token(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, rng: jax.Array,
    temperature: jax.Array, top_p: jax.Array, row_ids_B: jax.Array | None, *, top_k: int, greedy: bool,
    max_extra_length: int, use_cache: bool, eos_id: int,
) -> jax.Array:
    """Greedy or sampled [B, L] outputs (one hypothesis per sentence)."""
    max_lengths_B, output_length = output_lengths(config, src_tokens, max_extra_length)
    make_step = cached_step if use_cache else prefix_step
    step_fn, state = make_step(params, config, src_tokens, 1, output_length)
    choose = greedy_choice if greedy else sampling_choice(temperature, top_k, top_p)
    return token_loop(step_fn, state, max_lengths_B, output_length, choose, rng, eos_id=eos_id,
                      row_ids_B=row_ids_B)[0]


def greedy_decode(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, *, max_extra_length: int = 50,
    use_cache: bool = True, eos_id: int = EOS_ID,
) -> jax.Array:
    """[B, S] source ids -> [B, L] greedy output ids (L = min(S + max_extra_length, config.max_len))."""
    check_search_settings(max_extra_length=max_extra_length)
    return _token_by_token(params, config, jnp.asarray(src_tokens, jnp.int32), jax.random.key(0),
                           1.0, 1.0, None, top_k=0, greedy=True, max_extra_length=max_extra_length,
                           use_cache=use_cache, eos_id=eos_id)


def sample_decode(
    params: Any, config: TransformerConfig, src_tokens: jax.Array, rng: jax.Array, *,
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, max_extra_length: int = 50,
    eos_id: int = EOS_ID, row_ids: jax.Array | None = None,
) -> jax.Array:
    """[B, S] source ids -> [B, L] ids sampled from softmax(logits / temperature), top-k/top-p filtered.

    Each row draws from `rng` folded with its id (`row_ids` [B], default its place in the batch): a sentence
    given the same id and key samples the same tokens in any batch, on any device."""
    check_search_settings(temperature=temperature, top_k=top_k, top_p=top_p, max_extra_length=max_extra_length)
    require(top_k <= config.vocab_size, f"top_k={top_k} must be at most vocab_size={config.vocab_size} (0 keeps every "
            "token)")
    return _token_by_token(params, config, jnp.asarray(src_tokens, jnp.int32), rng, temperature, top_p,
                           None if row_ids is None else jnp.asarray(row_ids), top_k=top_k, greedy=False,
                           max_extra_length=max_extra_length, use_cache=True, eos_id=eos_id)
