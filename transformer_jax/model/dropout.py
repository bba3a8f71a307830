"""Dropout (paper section 5.4, "Residual Dropout"), with masks drawn 16 random bits per element on CPUs.

Flax's `nn.Dropout` draws a 32-bit uniform per element. On CPUs each 32-bit random word here gives two
16-bit draws, which halves the random-number work: the base model's CPU train step went from
3.15 s with `nn.Dropout` to 3.00 s (2.83 s without dropout; BENCHMARKS.md), and the 1-byte mask is kept for
the backward pass. On TPUs and GPUs, where the step is bound by memory traffic, the split words cost more
than they save (XLA writes both halves to memory to concatenate them): there each element draws one 32-bit
word, compared with the same threshold scaled by 2^16, and XLA recomputes the mask inside the backward
pass's fusions instead of storing it (the base step on v5e-8: 17.27 -> 16.57 GB of memory traffic per
update, BENCHMARKS.md). An element is kept when its draw is below `round((1 - rate) * 2^16)` (times 2^16 for
a 32-bit draw), so the keep probability is that threshold / 2^16 (within 2^-17 of 1 - rate) on every
platform, and kept values are divided by exactly that probability: the expected output equals the input.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.attention_kernels import kernel_platform

DRAW_LEVELS = 2**16  # a 16-bit draw takes one of these many values


def keep_threshold(rate: float) -> int:
    """The number of 16-bit draws (out of 2^16) that keep an element at this dropout rate."""
    return round((1.0 - rate) * DRAW_LEVELS)


def keep_mask(rng: jax.Array, shape: tuple[int, ...], threshold: int, split_words: bool = True) -> jax.Array:
    """A boolean [*shape] mask, True with probability threshold / 2^16, from 16-bit draws (`split_words`) or
    32-bit ones.

    The random words have the input's leading dimensions, so a batch-sharded input draws its bits
    where it lives; split, the low halves serve the first ceil(last/2) features, the high halves the rest.
    """
    if not split_words:
        return jax.random.bits(rng, shape, jnp.uint32) < jnp.uint32(threshold * DRAW_LEVELS)
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
        on_cpu = kernel_platform() == "cpu"
        mask = keep_mask(self.make_rng(self.rng_collection), inputs.shape, threshold, split_words=on_cpu)
        if on_cpu:
            # Keep the 1-byte mask for the backward pass instead of letting XLA recompute it from the
            # random words inside the gradient's (transposing) fusions, which measured slower on CPU.
            mask = jax.lax.optimization_barrier(mask)
        keep_probability = threshold / DRAW_LEVELS
        return jnp.where(mask, inputs / jnp.asarray(keep_probability, inputs.dtype), jnp.zeros((), inputs.dtype))
