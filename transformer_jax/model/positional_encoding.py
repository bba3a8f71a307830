"""Positional encodings (paper section 3.5): the sinusoidal table, or a learned one."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.config import PositionalEncodingKind


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
