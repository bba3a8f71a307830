"""Dropout (paper section 5.4, "Residual Dropout"), with masks drawn 16 random bits per element.

Flax's `nn.Dropout` draws a 32-bit uniform per element. Here each 32-bit random word gives two
16-bit draws, which halves the random-number work: the base model's CPU train step went from
3.15 s with `nn.Dropout` to 3.00 s (2.83 s without dropout; BENCHMARKS.md). An element is kept when its draw is below
`round((1 - rate) * 2^16)`, so the keep probability is that threshold / 2^16 (within 2^-17 of
1 - rate), and kept values are divided by exactly that probability: the expected output equals the
input.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

DRAW_LEVELS = 2**16  # a 16-bit draw takes one of these many values


def keep_threshold(rate: float) -> int:
    """The number of 16-bit draws (out of 2^16) that keep an element at this dropout rate."""
    return round((1.0 - rate) * DRAW_LEVELS)


def keep_mask(rng: jax.Array, shape: tuple[int, ...], threshold: int) -> jax.Array:
    """A boolean [*shape] mask, True with probability threshold / 2^16, from 16-bit draws.

    The random words have the input's leading dimensions, so a batch-sharded input draws its bits
    where it lives; the low halves serve the first ceil(last/2) features, the high halves the rest.
    """
    last = shape[-1]
    words = jax.random.bits(rng, (*shape[:-1], (last + 1) // 2), jnp.uint32)
    draws = jnp.concatenate([words & 0xFFFF, words >> 16], axis=-1)[..., :last]
    return draws < jnp.uint32(threshold)


class Dropout(nn.Module):
    """Zero each element with probability `rate` and scale the rest by 1 / keep probability.

    A drop-in for `nn.Dropout(rate)` (same `deterministic` argument and 'dropout' rng stream).
    """

    rate: float
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, inputs: jax.Array, deterministic: bool | None = None) -> jax.Array:
        """Identity when deterministic (or rate 0); otherwise the dropped-out inputs."""
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        threshold = keep_threshold(self.rate)
        if deterministic or threshold >= DRAW_LEVELS:
            return inputs
        if threshold == 0:
            return jnp.zeros_like(inputs)
        mask = keep_mask(self.make_rng(self.rng_collection), inputs.shape, threshold)
        # Keep the 1-byte mask for the backward pass instead of letting XLA recompute it from the
        # random words inside the gradient's (transposing) fusions, which measured slower on CPU.
        mask = jax.lax.optimization_barrier(mask)
        keep_probability = threshold / DRAW_LEVELS
        return jnp.where(mask, inputs / jnp.asarray(keep_probability, inputs.dtype), jnp.zeros((), inputs.dtype))
