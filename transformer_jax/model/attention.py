"""Scaled dot-product attention and multi-head attention (paper section 3.2), with a decoding cache.

Shapes: B batch, T query length, S key/value length, H heads, K head dim (d_k = d_v).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.config import AttentionBackend
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.masks import combine_masks

# Masked logits are set to this large finite negative (not -inf) so no row can produce NaN.
MASK_VALUE = float(jnp.finfo(jnp.float32).min)

# Decoding state lives in four collections, one per kind, so no code has to tell them apart by name:
# the per-hypothesis table of which beam slot holds each earlier position's keys/values (the only
# state beam search reorders: [B*N, L] integers), the self-attention keys/values stored by sentence,
# beam slot and position ([B, N, L, H, K]: each written once, never moved), the encoder-decoder
# keys/values (one row per sentence, shared by its beams) and the step counters (shared by all).
HYPOTHESIS_CACHE = "cache"
SLOT_CACHE = "slot_cache"
ENCODER_CACHE = "encoder_cache"
DECODE_STEP = "decode_step"
# Pass as `mutable=` to the decoding call that creates the cache.
DECODING_COLLECTIONS = (HYPOTHESIS_CACHE, SLOT_CACHE, ENCODER_CACHE, DECODE_STEP)


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


def beam_slot_rows(
    cache_BxNxLxHxK: jax.Array, slots_BxNxL: jax.Array
) -> jax.Array:
    """[B, N, L, H, K] with row (b, n, l) = cache row (b, slots[b, n, l], l): each hypothesis' history."""
    batch, beams, length = slots_BxNxL.shape
    rows_BxNL = (slots_BxNxL * length + jnp.arange(length)).reshape(batch, beams * length)
    flat_BxNLxHxK = cache_BxNxLxHxK.reshape((batch, beams * length) + cache_BxNxLxHxK.shape[3:])
    gathered = jnp.take_along_axis(flat_BxNLxHxK, rows_BxNL[:, :, None, None], axis=1)
    return gathered.reshape(cache_BxNxLxHxK.shape)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Each of W^Q, W^K, W^V is one [d_model, h * d_k] projection (stored as [d_model, h, d_k]), so all
    heads are computed by one matmul. Called with `inputs_kv=None` it is self-attention; with
    `inputs_kv` it is encoder-decoder (cross) attention.

    With `decode=True` it keeps decoding state in the `DECODING_COLLECTIONS`:
      * self-attention writes the new position's key/value into a [B, N, L, H, K] cache each step
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
            self.has_variable(ENCODER_CACHE, "key") if is_cross else self.has_variable(SLOT_CACHE, "cached_key"))
        q_BxTxHxK = self._projection("query")(inputs_q)
        # No key bias: it adds the same q.b to every logit of a query, which the softmax cancels,
        # so it would be a parameter with an identically zero gradient.
        key_proj, value_proj = self._projection("key", use_bias=False), self._projection("value")
        if stepping and is_cross:
            out_BxTxHxK = self._cross_step(q_BxTxHxK, mask)
        elif stepping:
            out_BxTxHxK = self._self_step(q_BxTxHxK, key_proj(inputs_q), value_proj(inputs_q), mask, beam_slots)
        else:
            out_BxTxHxK = self._full_attention(
                q_BxTxHxK, key_proj, value_proj, inputs_q, inputs_kv, mask, beam_slots, deterministic)
        # Concatenate the heads and project back: [B, T, H, K] -> [B, T, d_model].
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
        self.put_variable(ENCODER_CACHE, "key", k_BxSxHxK)
        self.put_variable(ENCODER_CACHE, "value", v_BxSxHxK)
        return k_BxSxHxK, v_BxSxHxK

    def _create_slot_cache(self, k_BNxLxHxK: jax.Array, beam_slots: jax.Array | None) -> None:
        """Zero keys/values [B, N, L, H, K] (L: the creating call's query length) and the step counter."""
        batch_beams, length = k_BNxLxHxK.shape[:2]
        batch, beams = (batch_beams, 1) if beam_slots is None else beam_slots.shape[:2]
        shape = (batch, beams, length) + k_BNxLxHxK.shape[2:]
        self.variable(SLOT_CACHE, "cached_key", jnp.zeros, shape, k_BNxLxHxK.dtype)
        self.variable(SLOT_CACHE, "cached_value", jnp.zeros, shape, k_BNxLxHxK.dtype)
        self.variable(DECODE_STEP, "cache_index", lambda: jnp.array(0, jnp.int32))

    def _cross_step(self, q_BNx1xHxK: jax.Array, mask: jax.Array | None) -> jax.Array:
        """One position of encoder-decoder attention against the cached encoder keys/values."""
        k_BxSxHxK = self.get_variable(ENCODER_CACHE, "key")
        v_BxSxHxK = self.get_variable(ENCODER_CACHE, "value")
        _one_position(q_BNx1xHxK)
        q_BxNxHxK, mask = fold_beams_into_queries(q_BNx1xHxK, mask, k_BxSxHxK.shape[0])
        return self._attend(q_BxNxHxK, k_BxSxHxK, v_BxSxHxK, mask).reshape(q_BNx1xHxK.shape)

    def _attend(self, q_BxTxHxK: jax.Array, k_BxSxHxK: jax.Array, v_BxSxHxK: jax.Array,
                mask: jax.Array | None) -> jax.Array:
        """Inference attention by the configured backend, [B, T, H, K]."""
        if self.backend == "einsum":
            weights_BxHxTxS = attention_weights(q_BxTxHxK, k_BxSxHxK, mask)
            return jnp.einsum("bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
        return scaled_dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, backend=self.backend)

    def _self_step(
        self, q_BNx1xHxK: jax.Array, k_BNx1xHxK: jax.Array, v_BNx1xHxK: jax.Array, mask: jax.Array | None,
        beam_slots: jax.Array | None,
    ) -> jax.Array:
        """Writes this position's key/value in each hypothesis' own beam slot; attends to its history.

        Beam search never moves the cache: it reorders the small `beam_slots` table instead, and
        each hypothesis reads its ancestors' keys/values through it.
        """
        cached_key = self.variable(SLOT_CACHE, "cached_key")
        cached_value = self.variable(SLOT_CACHE, "cached_value")
        cache_index = self.variable(DECODE_STEP, "cache_index")
        batch, beams, length = cached_key.value.shape[:3]
        index = cache_index.value
        kv = k_BNx1xHxK.shape[2:]
        k_BxNxLxHxK = jax.lax.dynamic_update_slice_in_dim(
            cached_key.value, _one_position(k_BNx1xHxK).reshape((batch, beams, 1) + kv), index, axis=2)
        v_BxNxLxHxK = jax.lax.dynamic_update_slice_in_dim(
            cached_value.value, _one_position(v_BNx1xHxK).reshape((batch, beams, 1) + kv), index, axis=2)
        cached_key.value, cached_value.value = k_BxNxLxHxK, v_BxNxLxHxK
        cache_index.value = index + 1
        if beams > 1:
            if beam_slots is None:
                raise ValueError("decoding N > 1 hypotheses per sentence needs their beam_slots")
            k_BxNxLxHxK = beam_slot_rows(k_BxNxLxHxK, beam_slots)
            v_BxNxLxHxK = beam_slot_rows(v_BxNxLxHxK, beam_slots)
        # [B, N, L, H, K] -> [B*N, L, H, K]: the one-position query of each hypothesis against its history.
        k_BNxLxHxK = k_BxNxLxHxK.reshape((batch * beams, length) + kv)
        v_BNxLxHxK = v_BxNxLxHxK.reshape((batch * beams, length) + kv)
        written_1x1x1xL = (jnp.arange(length) <= index)[None, None, None, :]
        return self._attend(q_BNx1xHxK, k_BNxLxHxK, v_BNxLxHxK, combine_masks(mask, written_1x1x1xL))


def _one_position(x_BxTxHxK: jax.Array) -> jax.Array:
    """[B, 1, H, K] -> [B, H, K]; decoding feeds one position per step."""
    if x_BxTxHxK.shape[1] != 1:
        raise ValueError(f"decoding feeds one position per step, got {x_BxTxHxK.shape[1]}")
    return x_BxTxHxK[:, 0]
