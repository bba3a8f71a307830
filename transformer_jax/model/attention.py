"""Scaled dot-product attention and multi-head attention (paper section 3.2), with a decoding cache.

Shapes: B batch, T query length, S key/value length, H heads, K head dim (d_k = d_v).
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.config import AttentionBackend
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.masks import combine_masks

# Masked logits are set to this large finite negative (not -inf) so no row can produce NaN.
MASK_VALUE = float(jnp.finfo(jnp.float32).min)

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
# chunks it is given, so a decoding loop that gives the written ones reads no unwritten position.
FIRST_CHUNK = 32
SMALLEST_LAST_CHUNK = 16


def history_chunks(length: int) -> tuple[int, ...]:
    """Sizes of the self-attention cache's chunks for `length` positions: 32, 32, 64, 128, ...

    Doubling boundaries keep the chunks few (a decoding loop compiles one body per chunk) while
    a step reads less than twice the positions written; a last chunk under 16 positions joins the
    one before it.
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


def attention_weights(
    q_BxTxHxK: jax.Array, k_BxSxHxK: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """softmax(QK^T / sqrt(d_k) + mask) as float32 [B, H, T, S]; fully masked rows are all zeros."""
    q_BxTxHxK = q_BxTxHxK / jnp.sqrt(q_BxTxHxK.shape[-1]).astype(q_BxTxHxK.dtype)
    logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK)
    # The softmax runs in float32 even when the matmuls run in bfloat16.
    logits_BxHxTxS = logits_BxHxTxS.astype(jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits_BxHxTxS, axis=-1)
    logits_BxHxTxS = jnp.where(mask, logits_BxHxTxS, MASK_VALUE)
    weights_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
    return jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights_BxHxTxS, 0.0)


def scaled_dot_product_attention(
    q_BxTxHxK: jax.Array,
    k_BxSxHxK: jax.Array,
    v_BxSxHxK: jax.Array,
    mask: jax.Array | None = None,
    *,
    backend: AttentionBackend = "einsum",
) -> jax.Array:
    """Attention(Q, K, V) = softmax(QK^T / sqrt(d_k)) V per head, [B, T, H, K].

    `mask` is boolean, broadcastable to [B, H, T, S], True where attending is allowed. A query whose
    keys are all masked gets a zero output. The backends agree to float tolerance; see
    `AttentionBackend`. For attention dropout or the weights themselves, use `attention_weights`.
    """
    if backend == "einsum":
        weights_BxHxTxS = attention_weights(q_BxTxHxK, k_BxSxHxK, mask)
        return jnp.einsum("bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    implementation = "cudnn" if backend == "cudnn" else None
    if mask is not None:
        # Leading size-1 axes up to the 4 axes [B|1, H|1, T|1, S] the code below indexes.
        mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
    out_BxTxHxK = jax.nn.dot_product_attention(
        q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=mask, implementation=implementation
    )
    if mask is None:
        return out_BxTxHxK
    # The fused kernel gives a query with no allowed key the mean of the values: zero it instead, in
    # each head on its own ([B|1, H|1, T|1] -> [B|1, T|1, H|1, 1], broadcast over [B, T, H, K]).
    has_key_BxTxHx1 = jnp.swapaxes(jnp.any(mask, axis=-1), 1, 2)[..., None]
    return jnp.where(has_key_BxTxHx1, out_BxTxHxK, 0.0).astype(out_BxTxHxK.dtype)


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
    least one key per query in the first chunk. `read_chunks[i]` (a boolean [], default True) says
    whether chunk i holds a key any query may read: a chunk that holds none is not read at all (its
    dots sit under `lax.cond`), its keys take no weight and its values add nothing.
    """
    q_BxHxNxK = q_BxHxNxK / jnp.sqrt(q_BxHxNxK.shape[-1]).astype(q_BxHxNxK.dtype)
    read_chunks = read_chunks or [jnp.array(True)] * len(k_chunks)

    def logits(k: jax.Array) -> jax.Array:
        return jnp.einsum("bhnk,bhks->bhns", q_BxHxNxK, k).astype(jnp.float32)

    def unread_logits(k: jax.Array) -> jax.Array:
        return jnp.full(q_BxHxNxK.shape[:3] + k.shape[-1:], MASK_VALUE, jnp.float32)

    logits_BxHxNxS = jnp.concatenate(
        [logits(k) if i == 0 else jax.lax.cond(read, logits, unread_logits, k)
         for i, (k, read) in enumerate(zip(k_chunks, read_chunks))], axis=-1)
    weights_BxHxNxS = jax.nn.softmax(jnp.where(mask, logits_BxHxNxS, MASK_VALUE), axis=-1)
    ends = np.cumsum([v.shape[2] for v in v_chunks])[:-1].tolist()
    weights = jnp.split(weights_BxHxNxS.astype(v_chunks[0].dtype), ends, axis=-1)

    def values(w: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.einsum("bhns,bhsk->bhnk", w, v)

    def unread_values(w: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.zeros(w.shape[:3] + v.shape[-1:], v.dtype)

    outs = [values(w, v) if i == 0 else jax.lax.cond(read, values, unread_values, w, v)
            for i, (w, v, read) in enumerate(zip(weights, v_chunks, read_chunks))]
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


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Each of W^Q, W^K, W^V is one [d_model, h * d_k] projection (stored as [d_model, h, d_k]), so all
    heads are computed by one matmul. Called with `inputs_kv=None` it is self-attention; with
    `inputs_kv` it is encoder-decoder (cross) attention.

    With `decode=True` it keeps decoding state in the `DECODING_COLLECTIONS`:
      * self-attention writes the new position's key/value into the slot cache each step
        (collection 'slot_cache'), in each hypothesis' own beam slot, at its step counter
        (collection 'decode_step'), and reads each hypothesis' history through the `beam_slots`
        table its caller keeps; L is the query length of the call that creates the cache;
      * cross-attention projects the encoder output to keys/values once, when the cache is created
        (collection 'encoder_cache'), and reuses them at every later step. Queries may carry N
        hypotheses (beams) per sentence, [B*N, T, ...] against [B, S, ...] encoder keys/values: the
        beams then share one copy of them.
    """

    num_heads: int
    d_model: int
    attention_dropout_rate: float = 0.0
    backend: AttentionBackend = "einsum"
    decode: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def _projection(self, name: str, use_bias: bool = True) -> nn.DenseGeneral:
        head_dim = self.d_model // self.num_heads
        return nn.DenseGeneral(
            features=(self.num_heads, head_dim),
            use_bias=use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.xavier_uniform(), ("embed", "heads", "kv")
            ),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("heads", "kv")),
            name=name,
        )

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        *,
        beam_slots: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """[B, T, d_model] queries (and [B, S, d_model] keys/values) -> [B, T, d_model].

        `beam_slots` ([B, N, L] ints, decoding self-attention only) says which beam slot of its
        sentence holds each position's keys/values for each of the B*N query rows.
        """
        is_cross = inputs_kv is not None
        stepping = self.decode and (
            self.has_variable(ENCODER_CACHE, "key") if is_cross else self.has_variable(SLOT_CACHE, cache_name("key", 0)))
        if stepping and not is_cross:
            out_BxTxHxK = self._self_step(*self._step_projections(inputs_q), mask, beam_slots)
            return self._output_projection(out_BxTxHxK)
        q_BxTxHxK = self._projection("query")(inputs_q)
        # No key bias: it adds the same q.b to every logit of a query, which the softmax cancels,
        # so it would be a parameter with an identically zero gradient.
        key_proj, value_proj = self._projection("key", use_bias=False), self._projection("value")
        if stepping:
            out_BxTxHxK = self._cross_step(q_BxTxHxK, mask)
        else:
            out_BxTxHxK = self._full_attention(
                q_BxTxHxK, key_proj, value_proj, inputs_q, inputs_kv, mask, beam_slots, deterministic)
        return self._output_projection(out_BxTxHxK)

    def _output_projection(self, out_BxTxHxK: jax.Array) -> jax.Array:
        """W^O: concatenates the heads and projects back, [B, T, H, K] -> [B, T, d_model]."""
        return nn.DenseGeneral(
            features=self.d_model,
            axis=(-2, -1),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.xavier_uniform(), ("heads", "kv", "embed")
            ),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            name="out",
        )(out_BxTxHxK)

    def _step_projections(self, x_BNx1xD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """A decoding step's self-attention queries, keys and values, [B*N, 1, H, K] each, by one matmul.

        The same W^Q, W^K, W^V (and biases) as the three projections, read from this module's
        parameters (a decoding step never creates them) and concatenated over the heads: a step's one
        token per hypothesis makes three small matmuls cost about twice one of three times the width,
        and the concatenation of loop-invariant weights is hoisted out of the decoding loop.
        """
        params = nn.unbox(self.variables["params"])
        kernels = [params[name]["kernel"] for name in ("query", "key", "value")]  # [D, H, K] each
        heads, head_dim = kernels[0].shape[1:]
        biases = [params["query"]["bias"], jnp.zeros((heads, head_dim), kernels[1].dtype), params["value"]["bias"]]
        kernel_Dx3HxK = jnp.concatenate(kernels, axis=1).astype(self.dtype)
        qkv_BNx1x3HxK = jnp.einsum("btd,dhk->bthk", x_BNx1xD.astype(self.dtype), kernel_Dx3HxK)
        qkv_BNx1x3HxK = qkv_BNx1x3HxK + jnp.concatenate(biases, axis=0).astype(self.dtype)
        return tuple(jnp.split(qkv_BNx1x3HxK, 3, axis=2))

    def _full_attention(
        self, q_BxTxHxK: jax.Array, key_proj: nn.Module, value_proj: nn.Module, inputs_q: jax.Array,
        inputs_kv: jax.Array | None, mask: jax.Array | None, beam_slots: jax.Array | None,
        deterministic: bool,
    ) -> jax.Array:
        """Attention of all T queries, [B, T, H, K]; with `decode`, it also creates the decoding state."""
        if self.decode and inputs_kv is not None:
            k_BxSxHxK, v_BxSxHxK = self._cross_kv(key_proj, value_proj, inputs_kv)
            q_BxTxHxK, mask = fold_beams_into_queries(q_BxTxHxK, mask, k_BxSxHxK.shape[0])
        else:
            source = inputs_q if inputs_kv is None else inputs_kv
            k_BxSxHxK, v_BxSxHxK = key_proj(source), value_proj(source)
            if self.decode:
                self._create_slot_cache(k_BxSxHxK, beam_slots)
        dropout_active = self.attention_dropout_rate > 0.0 and not deterministic
        if dropout_active or self.backend == "einsum":
            weights_BxHxTxS = attention_weights(q_BxTxHxK, k_BxSxHxK, mask)
            self.sow("intermediates", "attention_weights", weights_BxHxTxS)
            if dropout_active:
                weights_BxHxTxS = Dropout(self.attention_dropout_rate)(
                    weights_BxHxTxS, deterministic=False
                )
            out_BxTxHxK = jnp.einsum(
                "bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK
            )
        else:
            out_BxTxHxK = scaled_dot_product_attention(
                q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, backend=self.backend
            )
        # Undo any beam folding ([B, N*T, H, K] -> [B*N, T, H, K]; otherwise a no-op).
        return out_BxTxHxK.reshape(inputs_q.shape[:2] + out_BxTxHxK.shape[2:])

    def _cross_kv(
        self, key_proj: nn.Module, value_proj: nn.Module, inputs_kv: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Projects the encoder keys/values into the cache (once, when the cache is created)."""
        k_BxSxHxK, v_BxSxHxK = key_proj(inputs_kv), value_proj(inputs_kv)
        self.put_variable(ENCODER_CACHE, "key", k_BxSxHxK.transpose(0, 2, 3, 1))  # [B, H, K, S]
        self.put_variable(ENCODER_CACHE, "value", v_BxSxHxK.transpose(0, 2, 1, 3))  # [B, H, S, K]
        return k_BxSxHxK, v_BxSxHxK

    def _create_slot_cache(self, k_BNxLxHxK: jax.Array, beam_slots: jax.Array | None) -> None:
        """Zero keys [B, H, K, C*N] and values [B, H, C*N, K] per chunk of C positions of L.

        L is the creating call's query length, split by `history_chunks`.
        """
        batch_beams, length, heads, head_dim = k_BNxLxHxK.shape
        batch, beams = (batch_beams, 1) if beam_slots is None else beam_slots.shape[:2]
        dtype = k_BNxLxHxK.dtype
        for chunk, size in enumerate(history_chunks(length)):
            self.variable(SLOT_CACHE, cache_name("key", chunk), jnp.zeros, (batch, heads, head_dim, size * beams), dtype)
            self.variable(SLOT_CACHE, cache_name("value", chunk), jnp.zeros, (batch, heads, size * beams, head_dim), dtype)
        self.variable(DECODE_STEP, "cache_index", lambda: jnp.array(0, jnp.int32))

    def _cross_step(self, q_BNx1xHxK: jax.Array, mask: jax.Array | None) -> jax.Array:
        """One position of encoder-decoder attention against the cached encoder keys/values.

        The N beams of a sentence are its N queries against its one copy of the keys/values.
        """
        k_BxHxKxS = self.get_variable(ENCODER_CACHE, "key")
        v_BxHxSxK = self.get_variable(ENCODER_CACHE, "value")
        batch = k_BxHxKxS.shape[0]
        mask = fold_step_mask(mask, batch, 1)
        mask = jnp.ones((1, 1, 1, 1), bool) if mask is None else mask
        return heads_last(cached_attention(heads_first(q_BNx1xHxK, batch), [k_BxHxKxS], [v_BxHxSxK], mask))

    def _self_step(
        self, q_BNx1xHxK: jax.Array, k_BNx1xHxK: jax.Array, v_BNx1xHxK: jax.Array, mask: jax.Array | None,
        beam_slots: jax.Array | None,
    ) -> jax.Array:
        """Writes this position's key/value in each hypothesis' own beam slot; attends to its history.

        Beam search never moves the cache: it reorders the small `beam_slots` table instead. Each
        query attends to all N slots' keys of its sentence, [N*L] of them, masked to the ones its
        ancestors wrote (`history_mask`): N times the (small) attention arithmetic of a gather of
        each hypothesis' history, but no [B*N, L, H, K] copy of every layer's cache each step.

        The cache is kept in chunks of positions (`history_chunks`); a step reads only those that
        start at or before its own position (`cache_index`), so early steps do not read the whole
        length's unwritten keys/values.
        """
        chunks = 0
        while self.has_variable(SLOT_CACHE, cache_name("key", chunks)):
            chunks += 1
        cached_keys = [self.variable(SLOT_CACHE, cache_name("key", i)) for i in range(chunks)]
        cached_values = [self.variable(SLOT_CACHE, cache_name("value", i)) for i in range(chunks)]
        cache_index = self.variable(DECODE_STEP, "cache_index")
        batch = cached_keys[0].value.shape[0]
        index = cache_index.value
        q_BxHxNxK = heads_first(q_BNx1xHxK, batch)
        beams = q_BxHxNxK.shape[2]
        k_BxHxKxN = heads_first(k_BNx1xHxK, batch).transpose(0, 1, 3, 2)
        v_BxHxNxK = heads_first(v_BNx1xHxK, batch)
        start, read_chunks = 0, []
        for cached_key, cached_value in zip(cached_keys, cached_values):
            read_chunks.append(index >= start)
            size = cached_value.value.shape[2] // beams
            # Position `index` is the contiguous run of N slots at (index - start) * N of the chunk
            # that holds it; the others get back what they held (a [B, H, K, N] read and write).
            # The updated caches feed the dots as they are, so XLA updates them in place.
            inside = (index >= start) & (index < start + size)
            at = jnp.clip(index - start, 0, size - 1) * beams
            cached_key.value = _write_if(cached_key.value, k_BxHxKxN, at, 3, inside)
            cached_value.value = _write_if(cached_value.value, v_BxHxNxK, at, 2, inside)
            start += size
        cache_index.value = index + 1
        if beam_slots is None:
            if beams > 1:
                raise ValueError("decoding N > 1 hypotheses per sentence needs their beam_slots")
            beam_slots = jnp.zeros((batch, 1, start), jnp.int32)
        history = combine_masks(fold_step_mask(mask, batch, beams), history_mask(beam_slots, index))
        out_BxHxNxK = cached_attention(
            q_BxHxNxK, [k.value for k in cached_keys], [v.value for v in cached_values], history, read_chunks)
        return heads_last(out_BxHxNxK)


def _write_if(cache: jax.Array, update: jax.Array, at: jax.Array, axis: int, write: jax.Array) -> jax.Array:
    """`cache` with `update` written at `at` along `axis` where `write` holds, else unchanged."""
    held = jax.lax.dynamic_slice_in_dim(cache, at, update.shape[axis], axis=axis)
    return jax.lax.dynamic_update_slice_in_dim(cache, jnp.where(write, update, held), at, axis=axis)
