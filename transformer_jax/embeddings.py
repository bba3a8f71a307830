"""Token embeddings scaled by sqrt(d_model) (paper section 3.4) and positional encodings (section 3.5)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import PositionalEncodingKind


def sinusoidal_encoding(positions: jax.Array, d_model: int) -> jax.Array:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...), interleaved, float32.

    `positions` is any integer array [...]; the result is [..., d_model].
    """
    two_i = np.arange(0, d_model, 2, dtype=np.float32)
    inverse_frequency = jnp.asarray(1.0 / (10000.0 ** (two_i / d_model)))
    angles = positions[..., None].astype(jnp.float32) * inverse_frequency
    # [..., d/2, 2] with (sin, cos) pairs -> [..., d]: dimension 2i is sin, 2i+1 is cos.
    pairs = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return pairs.reshape(*positions.shape, -1)[..., :d_model]


class TokenEmbedding(nn.Module):
    """An embedding table E [vocab, d_model]: lookups are scaled by sqrt(d_model); `attend` is x E^T.

    One instance can serve the encoder input, the decoder input and the pre-softmax projection, as
    in the paper, so all three train a single weight matrix.
    """

    vocab_size: int
    d_model: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self) -> None:
        # std d_model^-0.5: after the sqrt(d_model) scaling the embedded vectors have unit scale.
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(
                nn.initializers.normal(stddev=self.d_model**-0.5), ("vocab", "embed")
            ),
            (self.vocab_size, self.d_model),
            self.param_dtype,
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[B, T] token ids -> [B, T, d_model] vectors, multiplied by sqrt(d_model)."""
        vectors = jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)
        return vectors * jnp.sqrt(self.d_model).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """[B, T, d_model] -> [B, T, vocab] float32 logits against the same table."""
        return jnp.einsum(
            "btd,vd->btv",
            x.astype(self.dtype),
            self.embedding.astype(self.dtype),
            preferred_element_type=jnp.float32,
        )


class OutputProjection(nn.Module):
    """The pre-softmax linear map when it is not tied to the embedding: x W + b, float32 logits.

    The matmul runs in the compute dtype and accumulates in float32, like `TokenEmbedding.attend`.
    """

    vocab_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        """[B, T, d_model] -> [B, T, vocab] float32 logits."""
        kernel = self.param(
            "kernel",
            nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("embed", "vocab")),
            (x_BxTxD.shape[-1], self.vocab_size),
            self.param_dtype,
        )
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
            (self.vocab_size,), self.param_dtype,
        )
        logits_BxTxV = jnp.einsum(
            "btd,dv->btv", x_BxTxD.astype(self.dtype), kernel.astype(self.dtype),
            preferred_element_type=jnp.float32,
        )
        return logits_BxTxV + bias.astype(jnp.float32)


class PositionalEncoding(nn.Module):
    """Position vectors [B, T, d_model] for explicit integer positions (packed rows restart at 0)."""

    d_model: int
    max_len: int
    kind: PositionalEncodingKind = "sinusoidal"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, positions: jax.Array) -> jax.Array:
        """[B, T] positions -> [B, T, d_model] encodings in the compute dtype."""
        if self.kind == "sinusoidal":
            return sinusoidal_encoding(positions, self.d_model).astype(self.dtype)
        table = self.param(
            "position_embedding",
            nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
            (self.max_len, self.d_model),
            self.param_dtype,
        )
        # Positions past the table (only padding of over-wide batches) reuse the last row, not NaN.
        return jnp.take(table, positions, axis=0, mode="clip").astype(self.dtype)
