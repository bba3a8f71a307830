"""Dropout (paper section 5.4, "Residual Dropout"): on CPUs from 16-bit threefry draws, on TPUs and GPUs from a
keyed integer hash that XLA recomputes where the mask is used.

Flax's `nn.Dropout` draws a 32-bit uniform per element from threefry. On CPUs each 32-bit random word here gives
two 16-bit draws, which halves the random-number work: the base model's CPU train step went from 3.15 s with
`nn.Dropout` to 3.00 s (2.83 s without dropout; BENCHMARKS.md), and the 1-byte mask is kept for the backward pass.

On TPUs and GPUs the step is bound by memory traffic, and a stored mask costs more than recomputing it: each
element's 32-bit word there is a hash of its position in the tensor, keyed by two words drawn from the dropout
key, so XLA recomputes the mask inside the backward pass's fusions and stores nothing. Threefry (20 rounds of
adds, rotations and xors per word) made that recomputation the largest arithmetic cost outside the matmuls:
4.5M of the base step's 25.9M cycles on v5e-8 by the TPU compiler's own estimates. Two rounds of a
multiply-xorshift hash cost 0.4M (BENCHMARKS.md). The masks do not depend on how the tensor is sharded (the hash
takes the element's global position), and are tested for the keep rate and for independence between neighbours,
rows, keys and steps (tests/model/test_dropout.py).

An element is kept when its draw is below `round((1 - rate) * 2^16)` (times 2^16 for a 32-bit draw), so the keep
probability is that threshold / 2^16 (within 2^-17 of 1 - rate) on every platform, and kept values are divided by
exactly that probability: the expected output equals the input.
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


def _mix(x: jax.Array) -> jax.Array:
    """A bijective 32-bit integer hash with low bias (two xorshift-multiply rounds, "lowbias32")."""
    x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hashed_words(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32[*shape]: one word per element, a keyed hash of the element's position.

    Two words drawn from `rng` key the hash; the element's flat position (modulo 2^32) goes through one round
    and its row (the position over the leading dimensions) is mixed into the second, so tensors of more than
    2^32 elements do not repeat. Every word is a function of its position alone, so XLA computes it inside
    whichever fusion uses it, and a sharded tensor's shards hash their own positions.
    """
    if not shape:
        return hashed_words(rng, (1,))[0]
    keys = jax.random.bits(rng, (2,), jnp.uint32)
    *leading, last = shape
    row = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(leading))):
        row = row + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
        stride *= leading[axis]
    flat = row * jnp.uint32(last % 2**32) + jax.lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
    return _mix(_mix(flat ^ keys[0]) ^ (row + keys[1]))


def keep_mask(rng: jax.Array, shape: tuple[int, ...], threshold: int, split_words: bool = True) -> jax.Array:
    """A boolean [*shape] mask, True with probability threshold / 2^16: from 16-bit threefry draws
    (`split_words`, CPUs) or from 32-bit hashed words (`hashed_words`, TPUs and GPUs).

    The threefry words have the input's leading dimensions, so a batch-sharded input draws its bits
    where it lives; split, the low halves serve the first ceil(last/2) features, the high halves the rest.
    """
    if not split_words:
        return hashed_words(rng, shape) < jnp.uint32(threshold * DRAW_LEVELS)
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
