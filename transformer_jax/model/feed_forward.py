"""Position-wise feed-forward network (paper section 3.3): FFN(x) = max(0, x W1 + b1) W2 + b2.

The non-linearity can also be swish (x sigmoid(x), as OPUS-MT's Marian models have it) or GELU.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

ACTIVATIONS = {"relu": nn.relu, "swish": nn.swish, "gelu": lambda x: nn.gelu(x, approximate=False)}
from transformer_jax.model.precision import dense_dot_general


class FeedForward(nn.Module):
    """Two linear maps d_model -> d_ff -> d_model with a ReLU (or `activation`) between, at every position."""

    d_model: int
    d_ff: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    float32_dot_outputs: bool = False  # see model/precision.py
    activation: str = "relu"  # a key of ACTIVATIONS

    @nn.compact
    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        """[B, T, d_model] -> [B, T, d_model]."""
        hidden_BxTxF = nn.Dense(
            self.d_ff,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general=dense_dot_general(self.float32_dot_outputs),
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.xavier_uniform(), ("embed", "mlp")
            ),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
            name="inner",
        )(x_BxTxD)
        return nn.Dense(
            self.d_model,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            dot_general=dense_dot_general(self.float32_dot_outputs),
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.xavier_uniform(), ("mlp", "embed")
            ),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            name="outer",
        )(ACTIVATIONS[self.activation](hidden_BxTxF))
