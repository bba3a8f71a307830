"""Scaled dot-product attention and multi-head attention (paper section 3.2), with a decoding cache.

The cache's collections, layout and step attention are in attention_cache.py.

Shapes: B batch, T query length, S key/value length, H heads, K head dim (d_k = d_v).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.attention_cache import (  # noqa: F401 (the collections are part of this module's API)
    DECODE_STEP,
    DECODING_COLLECTIONS,
    ENCODER_CACHE,
    HYPOTHESIS_CACHE,
    SLOT_CACHE,
    cache_name,
    cached_attention,
    fold_beams_into_queries,
    fold_step_mask,
    heads_first,
    heads_last,
    history_chunks,
    history_mask,
    write_if,
)
from transformer_jax.model.attention_kernels import (
    SegmentedMask,
    kernel_mask,
    resolve_backend,
    splash_applies,
    splash_attention,
)
from transformer_jax.model.config import AttentionBackend
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.masks import MASK_VALUE, combine_masks
from transformer_jax.model.precision import dense_dot_general, einsum


def attention_weights(
    q_BxTxHxK: jax.Array, k_BxSxHxK: jax.Array, mask: jax.Array | None = None, *,
    float32_dot_outputs: bool = False,
) -> jax.Array:
    """softmax(QK^T / sqrt(d_k) + mask) as float32 [B, H, T, S]; fully masked rows are all zeros.

    `float32_dot_outputs`: the logits come from the matmul in float32 (model/precision.py).
    """
    q_BxTxHxK = q_BxTxHxK / jnp.sqrt(q_BxTxHxK.shape[-1]).astype(q_BxTxHxK.dtype)
    logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                                preferred_element_type=jnp.float32 if float32_dot_outputs else None)
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
    mask: jax.Array | SegmentedMask | None = None,
    *,
    backend: AttentionBackend = "einsum",
) -> jax.Array:
    """Attention(Q, K, V) = softmax(QK^T / sqrt(d_k)) V per head, [B, T, H, K].

    `mask` is boolean, broadcastable to [B, H, T, S], True where attending is allowed, or a `SegmentedMask`
    (segment ids and a causal flag: what the splash kernel takes). A query whose keys are all masked gets a
    zero output (the splash kernel: see model/attention_kernels.py) and adds nothing to any gradient. The
    backends agree to float tolerance; see `AttentionBackend` ("auto": model/attention_kernels.resolve_backend).
    For attention dropout or the weights themselves, use `attention_weights`.
    """
    backend = resolve_backend(backend, 0.0, q_BxTxHxK.dtype)
    if isinstance(mask, SegmentedMask):
        if backend == "splash" and splash_applies(q_BxTxHxK.shape[1], k_BxSxHxK.shape[1]):
            return splash_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask)
        mask = mask.dense()
    if backend in ("einsum", "splash"):
        weights_BxHxTxS = attention_weights(q_BxTxHxK, k_BxSxHxK, mask)
        return jnp.einsum("bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    implementation = "cudnn" if backend == "cudnn" else None
    if mask is None:
        return jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, implementation=implementation)
    # Leading size-1 axes up to the 4 axes [B|1, H|1, T|1, S] the code below indexes. No query reaches the
    # kernel without a key (kernel_mask: cuDNN's backward pass turns such a row into NaN gradients).
    mask, has_key_BxHxTx1 = kernel_mask(jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape))
    out_BxTxHxK = jax.nn.dot_product_attention(
        q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=mask, implementation=implementation
    )
    # A query with no allowed key attended to every key: zero its output, in each head on its own
    # ([B|1, H|1, T|1, 1] -> [B|1, T|1, H|1, 1], broadcast over [B, T, H, K]).
    return jnp.where(jnp.swapaxes(has_key_BxHxTx1, 1, 2), out_BxTxHxK, 0.0).astype(out_BxTxHxK.dtype)


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
    float32_dot_outputs: bool = False  # see model/precision.py
    chunked_cache: bool = True  # the decoding self-attention cache in chunks read as reached (history_chunks)

    def _projection(self, name: str, use_bias: bool = True) -> nn.DenseGeneral:
        head_dim = self.d_model // self.num_heads
        return nn.DenseGeneral(
            features=(self.num_heads, head_dim),
            use_bias=use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general=dense_dot_general(self.float32_dot_outputs),
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
        mask: jax.Array | SegmentedMask | None = None,
        *,
        beam_slots: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """[B, T, d_model] queries (and [B, S, d_model] keys/values) -> [B, T, d_model].

        `mask`: a boolean [B|1, 1, T, S] array, or a `SegmentedMask` (the stacks pass these outside decoding:
        the splash kernel takes them, the other paths make the array from them). `beam_slots` ([B, N, L] ints, decoding self-attention only) says which beam slot of its
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
            dot_general=dense_dot_general(self.float32_dot_outputs),
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
        qkv_BNx1x3HxK = einsum("btd,dhk->bthk", x_BNx1xD.astype(self.dtype), kernel_Dx3HxK)
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
        backend = resolve_backend(self.backend, self.attention_dropout_rate, self.dtype)
        if isinstance(mask, SegmentedMask) and (dropout_active or backend != "splash"):
            mask = mask.dense()
        if dropout_active or backend == "einsum":
            weights_BxHxTxS = attention_weights(
                q_BxTxHxK, k_BxSxHxK, mask, float32_dot_outputs=self.float32_dot_outputs)
            self.sow("intermediates", "attention_weights", weights_BxHxTxS)
            if dropout_active:
                weights_BxHxTxS = Dropout(self.attention_dropout_rate)(
                    weights_BxHxTxS, deterministic=False
                )
            out_BxTxHxK = einsum("bhts,bshk->bthk", weights_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK,
                                 self.float32_dot_outputs)
        else:
            out_BxTxHxK = scaled_dot_product_attention(
                q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, backend=backend
            )
        # Undo any beam folding ([B, N*T, H, K] -> [B*N, T, H, K]; otherwise a no-op).
        return out_BxTxHxK.reshape(inputs_q.shape[:2] + out_BxTxHxK.shape[2:])

    def _cross_kv(
        self, key_proj: nn.Module, value_proj: nn.Module, inputs_kv: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Projects the encoder keys/values into the cache (once, when the cache is created)."""
        k_BxSxHxK, v_BxSxHxK = key_proj(inputs_kv), value_proj(inputs_kv)
        dtype = self._cache_dtype()
        self.put_variable(ENCODER_CACHE, "key", k_BxSxHxK.transpose(0, 2, 3, 1).astype(dtype))  # [B, H, K, S]
        self.put_variable(ENCODER_CACHE, "value", v_BxSxHxK.transpose(0, 2, 1, 3).astype(dtype))  # [B, H, S, K]
        return k_BxSxHxK, v_BxSxHxK

    def _cache_dtype(self) -> Any:
        """The decoding caches' dtype: the compute dtype, or float32 with `float32_dot_outputs`.

        The attention of a step is a batched matmul over the caches; XLA:CPU has no native bfloat16
        one and would convert whole caches to float32 at every step (model/precision.py).
        """
        return jnp.float32 if self.float32_dot_outputs else self.dtype

    def _create_slot_cache(self, k_BNxLxHxK: jax.Array, beam_slots: jax.Array | None) -> None:
        """Zero keys [B, H, K, C*N] and values [B, H, C*N, K] per chunk of C positions of L.

        L is the creating call's query length, split by `history_chunks` (one chunk without `chunked_cache`, for
        N > 1 hypotheses a sentence).
        """
        batch_beams, length, heads, head_dim = k_BNxLxHxK.shape
        batch, beams = (batch_beams, 1) if beam_slots is None else beam_slots.shape[:2]
        dtype = self._cache_dtype()
        # One hypothesis a sentence (greedy, sampling) keeps the chunks even without `chunked_cache`: XLA makes their
        # conditionals selects there (no host wait on a GPU), and XLA:GPU fails to compile the whole-cache step.
        chunked = self.chunked_cache or beams == 1
        for chunk, size in enumerate(history_chunks(length) if chunked else (length,)):
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
        q_BxHxNxK = heads_first(q_BNx1xHxK, batch).astype(k_BxHxKxS.dtype)
        return heads_last(cached_attention(q_BxHxNxK, [k_BxHxKxS], [v_BxHxSxK], mask)).astype(self.dtype)

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
        dtype = cached_keys[0].value.dtype
        q_BxHxNxK = heads_first(q_BNx1xHxK, batch).astype(dtype)
        beams = q_BxHxNxK.shape[2]
        k_BxHxKxN = heads_first(k_BNx1xHxK, batch).transpose(0, 1, 3, 2).astype(dtype)
        v_BxHxNxK = heads_first(v_BNx1xHxK, batch).astype(dtype)
        start, read_chunks = 0, []
        for cached_key, cached_value in zip(cached_keys, cached_values):
            read_chunks.append(index >= start)
            size = cached_value.value.shape[2] // beams
            # Position `index` is the contiguous run of N slots at (index - start) * N of the chunk
            # that holds it; the others get back what they held (a [B, H, K, N] read and write).
            # The updated caches feed the dots as they are, so XLA updates them in place.
            inside = (index >= start) & (index < start + size)
            at = jnp.clip(index - start, 0, size - 1) * beams
            cached_key.value = write_if(cached_key.value, k_BxHxKxN, at, 3, inside)
            cached_value.value = write_if(cached_value.value, v_BxHxNxK, at, 2, inside)
            start += size
        cache_index.value = index + 1
        if beam_slots is None:
            if beams > 1:
                raise ValueError("decoding N > 1 hypotheses per sentence needs their beam_slots")
            beam_slots = jnp.zeros((batch, 1, start), jnp.int32)
        history = combine_masks(fold_step_mask(mask, batch, beams), history_mask(beam_slots, index))
        out_BxHxNxK = cached_attention(
            q_BxHxNxK, [k.value for k in cached_keys], [v.value for v in cached_values], history, read_chunks)
        return heads_last(out_BxHxNxK).astype(self.dtype)
