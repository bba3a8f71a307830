"""The decoding cache of multi-head attention: its collections, its layout and a step's attention on it.

MultiHeadAttention (attention.py) keeps its decoding state here when built with `decode=True`;
decoding/step.py drives it. Shapes: B sentences, N hypotheses (beams) per sentence, H heads,
K head dim, S keys, L positions.
"""

from __future__ import annotations

import functools
import operator
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.masks import MASK_VALUE
from transformer_jax.model.precision import einsum

# Decoding state lives in four collections, one per kind, so no code has to tell them apart by name:
# the per-hypothesis table of which beam slot holds each earlier position's keys/values (the only
# state beam search reorders: [B*N, L] integers), the self-attention keys/values stored by sentence,
# beam slot and position (each written once, never moved), the encoder-decoder keys/values (one row
# per sentence, shared by its beams) and the step counters (shared by all). The caches are stored in
# the layouts the attention dots read with the (B, H) batch axes first, keys as [.., K, S] and values
# as [.., S, K], so no step transposes or copies them: self-attention keys [B, H, K, C*N], values
# [B, H, C*N, K] in chunks of C positions (`history_chunks`; position-major, so a step writes one
# contiguous run of N slots); encoder-decoder keys [B, H, K, S], values [B, H, S, K].
HYPOTHESIS_CACHE = "cache"
SLOT_CACHE = "slot_cache"
ENCODER_CACHE = "encoder_cache"
DECODE_STEP = "decode_step"
# Pass as `mutable=` to the decoding call that creates the cache.
DECODING_COLLECTIONS = (HYPOTHESIS_CACHE, SLOT_CACHE, ENCODER_CACHE, DECODE_STEP)
# The self-attention cache's chunk boundaries (positions): 32, 64, 128, ... A step reads only the
# chunks that start at or before its own position.
FIRST_CHUNK = 32
SMALLEST_LAST_CHUNK = 16


def history_chunks(length: int) -> tuple[int, ...]:
    """Sizes of the self-attention cache's chunks for `length` positions: 32, 32, 64, 128, ...

    Doubling boundaries keep the chunks few (each is one dot and one `lax.cond` per step and layer)
    while a step reads less than twice the positions written; a last chunk under 16 positions
    joins the one before it.
    """
    sizes, start = [], 0
    while start < length:
        end = min(length, max(FIRST_CHUNK, 2 * start))
        sizes.append(end - start)
        start = end
    if len(sizes) > 1 and sizes[-1] < SMALLEST_LAST_CHUNK:
        sizes[-2:] = [sizes[-2] + sizes[-1]]
    return tuple(sizes)


def cache_name(kind: str, chunk: int) -> str:
    """The slot cache variable holding chunk `chunk` of the keys ("key") or values ("value")."""
    return f"cached_{kind}_{chunk}"


def fold_beams_into_queries(
    q_BNxTxHxK: jax.Array, mask: jax.Array | None, batch: int
) -> tuple[jax.Array, jax.Array | None]:
    """[B*N, T, H, K] queries (and their mask) -> [B, N*T, H, K], so N beams attend to [B, S] keys.

    Query n*T + t of sentence b is beam n, position t. With N = 1 both are returned unchanged.
    """
    batch_beams, length, heads, head_dim = q_BNxTxHxK.shape
    if batch_beams == batch:
        return q_BNxTxHxK, mask
    if batch_beams % batch:
        raise ValueError(f"query batch {batch_beams} is not a multiple of the key batch {batch}")
    beams = batch_beams // batch
    q_BxNTxHxK = q_BNxTxHxK.reshape(batch, beams * length, heads, head_dim)
    if mask is None:
        return q_BxNTxHxK, None
    mask_heads, kv_len = mask.shape[1], mask.shape[-1]
    mask = jnp.broadcast_to(mask, (batch_beams, mask_heads, length, kv_len))
    # [B*N, H|1, T, S] -> [B, N, H|1, T, S] -> [B, H|1, N, T, S] -> [B, H|1, N*T, S].
    mask = mask.reshape(batch, beams, mask_heads, length, kv_len).transpose(0, 2, 1, 3, 4)
    return q_BxNTxHxK, mask.reshape(batch, mask_heads, beams * length, kv_len)


def cached_attention(
    q_BxHxNxK: jax.Array, k_chunks: list[jax.Array], v_chunks: list[jax.Array], mask: jax.Array,
    read_chunks: list[jax.Array] | None = None,
) -> jax.Array:
    """Decoding attention on caches in their stored layouts, [B, H, N, K] (N queries per sentence).

    The keys ([B, H, K, S_i] each) and values ([B, H, S_i, K]) come in chunks read where they lie;
    only the [B, H, N, sum S_i] logits are joined. `mask` ([B|1, H|1, N, sum S_i] boolean) leaves at
    least one key per query in the first chunk. `read_chunks[i]` (a boolean []) says whether chunk
    i > 0 holds a key any query may read (None: all do): a chunk that holds none is not read at all
    (its dots sit under `lax.cond`), its keys take no weight and its values add nothing. The first
    chunk is always read.
    """
    q_BxHxNxK = q_BxHxNxK / jnp.sqrt(q_BxHxNxK.shape[-1]).astype(q_BxHxNxK.dtype)
    reads = [None] + (list(read_chunks[1:]) if read_chunks else [None] * (len(k_chunks) - 1))

    def unless_unread(read: jax.Array | None, compute: Callable, skip: Callable, *operands: jax.Array) -> jax.Array:
        return compute(*operands) if read is None else jax.lax.cond(read, compute, skip, *operands)

    def logits(k: jax.Array) -> jax.Array:
        return jnp.einsum("bhnk,bhks->bhns", q_BxHxNxK, k, preferred_element_type=jnp.float32)

    def unread_logits(k: jax.Array) -> jax.Array:
        return jnp.full(q_BxHxNxK.shape[:3] + k.shape[-1:], MASK_VALUE, jnp.float32)

    logits_BxHxNxS = jnp.concatenate(
        [unless_unread(read, logits, unread_logits, k) for k, read in zip(k_chunks, reads)], axis=-1)
    weights_BxHxNxS = jax.nn.softmax(jnp.where(mask, logits_BxHxNxS, MASK_VALUE), axis=-1)
    ends = np.cumsum([v.shape[2] for v in v_chunks])[:-1].tolist()
    weights = jnp.split(weights_BxHxNxS.astype(v_chunks[0].dtype), ends, axis=-1)

    def values(w: jax.Array, v: jax.Array) -> jax.Array:
        return einsum("bhns,bhsk->bhnk", w, v)

    def unread_values(w: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.zeros(w.shape[:3] + v.shape[-1:], v.dtype)

    outs = [unless_unread(read, values, unread_values, w, v) for w, v, read in zip(weights, v_chunks, reads)]
    return functools.reduce(operator.add, outs)


def heads_first(x_BNx1xHxK: jax.Array, batch: int) -> jax.Array:
    """[B*N, 1, H, K] one-position rows -> [B, H, N, K]: the N hypotheses of a sentence side by side."""
    batch_beams, length, heads, head_dim = x_BNx1xHxK.shape
    if length != 1:
        raise ValueError(f"decoding feeds one position per step, got {length}")
    return x_BNx1xHxK.reshape(batch, batch_beams // batch, heads, head_dim).transpose(0, 2, 1, 3)


def heads_last(x_BxHxNxK: jax.Array) -> jax.Array:
    """[B, H, N, K] -> [B*N, 1, H, K], the inverse of `heads_first`."""
    batch, heads, beams, head_dim = x_BxHxNxK.shape
    return x_BxHxNxK.transpose(0, 2, 1, 3).reshape(batch * beams, 1, heads, head_dim)


def history_mask(slots_BxNxL: jax.Array, index: jax.Array) -> jax.Array:
    """[B, 1, N, L*N]: query n may read slot m's position l iff slots[b, n, l] == m and l <= index.

    The key axis is the self-attention cache's (position, slot) pair flattened, position-major.
    """
    batch, beams, length = slots_BxNxL.shape
    own_BxNxLxM = slots_BxNxL[:, :, :, None] == jnp.arange(beams)
    written_BxNxLxM = own_BxNxLxM & (jnp.arange(length) <= index)[:, None]
    return written_BxNxLxM.reshape(batch, 1, beams, length * beams)


def fold_step_mask(mask: jax.Array | None, batch: int, slots: int) -> jax.Array | None:
    """A caller's [B*N, H|1, 1, S'] step mask -> [B, H|1, N, S' * slots] (each key repeated per slot), or None."""
    if mask is None:
        return None
    batch_beams, mask_heads, _, kv_len = mask.shape
    beams = batch_beams // batch
    mask = mask.reshape(batch, beams, mask_heads, kv_len).transpose(0, 2, 1, 3)
    return jnp.repeat(mask, slots, axis=-1)


def write_if(cache: jax.Array, update: jax.Array, at: jax.Array, axis: int, write: jax.Array) -> jax.Array:
    """`cache` with `update` written at `at` along `axis` where `write` holds, else unchanged."""
    held = jax.lax.dynamic_slice_in_dim(cache, at, update.shape[axis], axis=axis)
    return jax.lax.dynamic_update_slice_in_dim(cache, jnp.where(write, update, held), at, axis=axis)
