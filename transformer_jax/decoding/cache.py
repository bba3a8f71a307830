"""The Transformer's decoding step, with its key/value cache, and the full-prefix reference step.

A step function `step_fn(tokens [B*N, 1], state) -> (log_probs [B*N, V], state)` is what the search
loops (sampling.py, beam_search.py) drive. `cached_step` runs one position per call against the
decoder's cache; `prefix_step` reruns the full forward pass on the whole prefix (the reference the
cached step is tested and benchmarked against). PAD and BOS are never generated.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.masks import PAD_ID
from transformer_jax.model.transformer import Transformer

# Token ids of the tokenizer (transformer_jax.data.tokenizer has the same; a test checks they agree).
BOS_ID = 2
EOS_ID = 3
NEG_INF = -jnp.inf
# step_fn(tokens [B*N, 1], state) -> (log-probabilities [B*N, V], state): one decoding step.
StepFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def _hypothesis_axis(path: tuple[Any, ...]) -> int:
    """Leaves of a scanned layer stack (module `layers`) carry the layer axis first, hypotheses second."""
    return 1 if any(getattr(key, "key", None) == "layers" for key in path) else 0


def reorder_hypotheses(state: Any, rows_BN: jax.Array) -> Any:
    """Gathers row `rows_BN[i]` of every leaf's hypothesis axis into row i.

    The hypothesis axis is the leading one, or the second in a scanned stack; leaves without it (step
    counters, per-layer counters) are kept as they are.
    """

    def reorder(path: tuple[Any, ...], x: jax.Array) -> jax.Array:
        axis = _hypothesis_axis(path)
        return jnp.take(x, rows_BN, axis=axis) if x.ndim > axis else x

    return jax.tree_util.tree_map_with_path(reorder, state)


def allowed_log_probs(logits_BxV: jax.Array) -> jax.Array:
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
        return allowed_log_probs(logits_BNx1xV[:, 0]), split(variables["cache"])

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
        return allowed_log_probs(logits_BNxV), {"prefix": prefix_BNxL, "step": position + 1}

    prefix_BNxL = jnp.full((src_BNxS.shape[0], output_length), PAD_ID, jnp.int32)
    return step, {"prefix": prefix_BNxL, "step": jnp.array(0, jnp.int32)}
