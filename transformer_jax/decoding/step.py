"""The Transformer's decoding step against its key/value cache, and the full-prefix reference step.

The cache itself (its collections, layouts and chunks) lives in model/attention_cache.py.

A step function `step_fn(tokens [B*N, 1], state) -> (log_probs [B*N, V], state)` is what the search
loops (sampling.py, beam_search.py) drive; its `StepState` keeps what is per hypothesis (reordered by
beam search) apart from what all hypotheses share. `cached_step` runs one position per call against
the decoder's cache; `prefix_step` reruns the full forward pass on the whole prefix (the reference the
cached step is tested and benchmarked against). PAD and BOS are never generated.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from transformer_jax.model.attention import (
    DECODE_STEP,
    DECODING_COLLECTIONS,
    ENCODER_CACHE,
    HYPOTHESIS_CACHE,
    SLOT_CACHE,
)
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, PAD_ID
from transformer_jax.model.transformer import Transformer

NEG_INF = -jnp.inf


@struct.dataclass
class StepState:
    """A step function's state: the part kept per hypothesis and the part all hypotheses share.

    Beam search reorders `per_hypothesis` as it keeps and drops hypotheses: every leaf has one row per
    hypothesis on axis `hypothesis_axis` (static). `shared` is never reordered.
    """

    per_hypothesis: Any
    shared: Any = None
    hypothesis_axis: int = struct.field(pytree_node=False, default=0)


# step_fn(tokens [B*N, 1], state) -> (log-probabilities [B*N, V], state): one decoding step. Beam
# search needs the state to be a StepState; greedy decoding and sampling take any state.
StepFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def reorder_hypotheses(per_hypothesis: Any, rows_BN: jax.Array, axis: int) -> Any:
    """Gathers row `rows_BN[i]` of axis `axis` of every leaf into row i."""
    return jax.tree.map(lambda x: jnp.take(x, rows_BN, axis=axis), per_hypothesis)


def allowed_log_probs(logits_BxV: jax.Array) -> jax.Array:
    """log_softmax over the tokens a decoder may emit (never PAD or BOS)."""
    token_ids_V = jnp.arange(logits_BxV.shape[-1])
    allowed_V = (token_ids_V != PAD_ID) & (token_ids_V != BOS_ID)
    return jax.nn.log_softmax(jnp.where(allowed_V, logits_BxV.astype(jnp.float32), NEG_INF), axis=-1)


def cached_step(
    params: Any, config: TransformerConfig, src_tokens_BxS: jax.Array, beam_size: int, output_length: int
) -> tuple[StepFn, StepState]:
    """The Transformer's one-position step against its key/value cache, and its initial state.

    The encoder runs once; each layer's encoder-decoder keys/values are projected once, kept at
    [B, S, H, K] outside the state and shared by the N beams of a sentence (the attention folds beams
    into its query axis). The self-attention keys/values are stored by beam slot, [B, N, L, H, K]
    per layer (a scanned stack puts its layer axis first), and never move: the state's
    per-hypothesis part is only the [B*N, L] table of which slot holds each earlier position of each
    hypothesis, so reordering hypotheses gathers B*N*L integers instead of every layer's cache.
    The caches and the step counters are the shared part. The self-attention cache is kept in
    chunks of positions (32, 32, 64, ...: `history_chunks`) and a step reads only the chunks
    written so far, so a sentence that ends at 20 tokens never reads the rest of a cache of 70.
    The caches take the dtype `config` gives them (`decoding.translate.decoding_precision` chooses it).
    """
    model = Transformer(config, decoding=True)
    encoded_BxSxD = model.apply({"params": params}, src_tokens_BxS, method=Transformer.encode)
    # Only the ids repeat per beam (for the cross-attention padding mask), not the encoder output.
    src_BNxS = jnp.repeat(src_tokens_BxS, beam_size, axis=0)
    dummy_BNxL = jnp.ones((src_BNxS.shape[0], output_length), jnp.int32)
    # Creates the cache; its logits are unused, so XLA drops that forward pass.
    _, variables = model.apply({"params": params}, encoded_BxSxD, src_BNxS, dummy_BNxL,
                               method=Transformer.decode, mutable=DECODING_COLLECTIONS)
    encoder_cache = variables[ENCODER_CACHE]
    stepped = [HYPOTHESIS_CACHE, SLOT_CACHE, DECODE_STEP]

    def step(tokens_BNx1: jax.Array, state: StepState) -> tuple[jax.Array, StepState]:
        logits_BNx1xV, variables = model.apply(
            {"params": params, ENCODER_CACHE: encoder_cache, HYPOTHESIS_CACHE: state.per_hypothesis,
             **state.shared},
            encoded_BxSxD, src_BNxS, tokens_BNx1, method=Transformer.decode, mutable=stepped)
        new_state = state.replace(per_hypothesis=variables[HYPOTHESIS_CACHE],
                                  shared={name: variables[name] for name in stepped[1:]})
        return allowed_log_probs(logits_BNx1xV[:, 0]), new_state

    shared = {name: variables[name] for name in stepped[1:]}
    return step, StepState(variables[HYPOTHESIS_CACHE], shared)


def prefix_step(
    params: Any, config: TransformerConfig, src_tokens_BxS: jax.Array, beam_size: int, output_length: int
) -> tuple[StepFn, StepState]:
    """A step without a cache: `Transformer.__call__` on the whole prefix padded to L, every step."""
    model = Transformer(config)
    src_BNxS = jnp.repeat(src_tokens_BxS, beam_size, axis=0)

    def step(tokens_BNx1: jax.Array, state: StepState) -> tuple[jax.Array, StepState]:
        position = state.shared
        prefix_BNxL = jax.lax.dynamic_update_slice_in_dim(
            state.per_hypothesis, tokens_BNx1, position, axis=1)
        logits_BNxLxV = model.apply({"params": params}, src_BNxS, prefix_BNxL)
        logits_BNxV = jax.lax.dynamic_index_in_dim(logits_BNxLxV, position, axis=1, keepdims=False)
        return allowed_log_probs(logits_BNxV), StepState(prefix_BNxL, position + 1)

    # The state is the [B*N, L] prefix of each hypothesis and the position to write next.
    prefix_BNxL = jnp.full((src_BNxS.shape[0], output_length), PAD_ID, jnp.int32)
    return step, StepState(prefix_BNxL, jnp.array(0, jnp.int32))
