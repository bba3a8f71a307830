"""One entry point for every decoding mode: source ids and DecodeOptions in, output ids out."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.sampling import greedy_decode, sample_decode
from transformer_jax.model.config import TransformerConfig


def in_dtype(params: Any, config: TransformerConfig, dtype: str) -> tuple[Any, TransformerConfig]:
    """`params` cast to `dtype` and `config` computing and storing in it; unchanged for dtype ''.

    Floating-point leaves only (LayerNorm statistics, softmax and logits stay float32 in the model).
    """
    if not dtype or (config.dtype, config.param_dtype) == (dtype, dtype):
        return params, config
    target = jnp.dtype(dtype)
    cast = jax.tree.map(lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    return cast, config.replace(dtype=dtype, param_dtype=dtype)


def translate_batch(
    params: Any, config: TransformerConfig, src_tokens: jax.Array,
    options: DecodeOptions = DecodeOptions(), rng: jax.Array | None = None,
) -> jax.Array:
    """[B, S] source ids -> [B, L] output ids by `options.mode`: "beam" (the best), "greedy" or "sample".

    Sampling draws from `rng`, or from `jax.random.key(options.seed)` when none is given. With
    `options.dtype`, the weights are cast to it first (inside a caller's jit: once per call; to
    translate many batches, cast once with `in_dtype` and pass dtype='').
    """
    params, config = in_dtype(params, config, options.dtype)
    if options.mode == "beam":
        return beam_search(params, config, src_tokens, beam_size=options.beam_size, alpha=options.alpha,
                           max_extra_length=options.max_extra_length)[0][:, 0]
    if options.mode == "greedy":
        return greedy_decode(params, config, src_tokens, max_extra_length=options.max_extra_length)
    rng = jax.random.key(options.seed) if rng is None else rng
    return sample_decode(params, config, src_tokens, rng, temperature=options.temperature,
                         top_k=options.top_k, top_p=options.top_p, max_extra_length=options.max_extra_length)
