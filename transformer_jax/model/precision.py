"""Matmuls in the compute dtype that hand back a float32 result, rounded to the compute dtype after.

Every backend accumulates a bfloat16 matmul in float32; what differs is the type the dot op returns.
XLA:CPU runs bfloat16 x bfloat16 -> float32 natively but emulates a bfloat16 result by converting
both operands (weights included) to float32 at every call, which makes a bfloat16 model slower on a
CPU than a float32 one. With `TransformerConfig.float32_dot_outputs` the model's matmuls ask for the
float32 result and round it: the same values up to summation order, at bfloat16 speed on CPUs.
With it, the decoding caches (read by batched matmuls, which XLA:CPU has no native bfloat16 form
of) are float32 too. Decoding on CPUs turns it on (`decoding.translate.decoding_precision`); accelerators
keep the model's dtypes (bfloat16 caches take half the memory); training leaves it off (remat='dots'
would then keep float32 copies of the projection outputs).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def float32_output_dot_general(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None,
    preferred_element_type: Any = None, **kwargs: Any,
) -> jax.Array:
    """`lax.dot_general` returning float32, then cast to the operands' (or the asked) dtype."""
    out = jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                              preferred_element_type=jnp.float32, **kwargs)
    return out.astype(preferred_element_type or jnp.result_type(lhs, rhs))


def dense_dot_general(float32_outputs: bool) -> Callable | None:
    """The `dot_general` for a Flax Dense/DenseGeneral: None (Flax's own) unless `float32_outputs`."""
    return float32_output_dot_general if float32_outputs else None


def einsum(spec: str, lhs: jax.Array, rhs: jax.Array, float32_outputs: bool = True) -> jax.Array:
    """`jnp.einsum` of two operands in their dtype; with `float32_outputs`, via a float32 result."""
    if not float32_outputs:
        return jnp.einsum(spec, lhs, rhs)
    return jnp.einsum(spec, lhs, rhs, preferred_element_type=jnp.float32).astype(jnp.result_type(lhs, rhs))
