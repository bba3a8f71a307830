"""Token embeddings shared by source, target and the pre-softmax projection, scaled by sqrt(d_model) (paper section 3.4)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


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
