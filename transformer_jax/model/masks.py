"""Attention masks: padding, causal (look-ahead), segment (packed rows), and their combination.

Every mask is boolean, True where a query may attend to a key, shaped [batch, heads, q_len, kv_len]
(with size-1 axes where it broadcasts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer_jax.model.special_tokens import PAD_ID
# Masked logits are set to this large finite negative (not -inf) so no row can produce NaN.
MASK_VALUE = float(jnp.finfo(jnp.float32).min)


def padding_mask(q_tokens: jax.Array, kv_tokens: jax.Array, pad_id: int = PAD_ID) -> jax.Array:
    """[B, 1, Tq, Tk]: True where neither the query token nor the key token is padding."""
    return (q_tokens != pad_id)[:, None, :, None] & (kv_tokens != pad_id)[:, None, None, :]



def causal_mask(length: int) -> jax.Array:
    """[1, 1, T, T]: True where key position <= query position (no look-ahead)."""
    positions = jnp.arange(length)
    return (positions[None, :] <= positions[:, None])[None, None]


def segment_mask(q_segments: jax.Array, kv_segments: jax.Array) -> jax.Array:
    """[B, 1, Tq, Tk]: True where query and key belong to the same packed segment."""
    return q_segments[:, None, :, None] == kv_segments[:, None, None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the given masks (None entries are skipped; all None gives None)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = combined & mask
    return combined
