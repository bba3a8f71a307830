"""Length limits of decoding: each output at most its source length + max_extra_length, and GNMT's length penalty."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import PAD_ID


def length_penalty(length: jax.Array, alpha: float | jax.Array) -> jax.Array:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting EOS; a hypothesis scores log P(Y) / lp(Y)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def max_output_lengths(src_tokens: jax.Array, max_extra_length: int, max_len: int) -> jax.Array:
    """[B] longest output per sentence: its non-pad source tokens + max_extra_length, at most max_len."""
    source_lengths_B = jnp.sum(src_tokens != PAD_ID, axis=-1, dtype=jnp.int32)
    # Capped first: a larger limit allows no more tokens, and source + limit must fit in int32.
    return jnp.minimum(source_lengths_B + min(max_extra_length, max_len), max_len)


def output_width(source_width: int, max_extra_length: int, max_len: int) -> int:
    """The output width L (static) of a batch of sources `source_width` tokens wide: the decode loop's most steps."""
    return min(source_width + max_extra_length, max_len)


def output_lengths(
    config: TransformerConfig, src_tokens: jax.Array, max_extra_length: int
) -> tuple[jax.Array, int]:
    """Per-sentence maximum output lengths [B] and the output width L (static)."""
    output_length = output_width(src_tokens.shape[1], max_extra_length, config.max_len)
    return max_output_lengths(src_tokens, max_extra_length, config.max_len), output_length
