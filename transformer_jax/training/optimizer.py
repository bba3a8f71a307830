"""The paper's learning-rate schedule and Adam (section 5.3)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax


def paper_learning_rate(
    d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> Callable[[jax.Array], jax.Array]:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

    Returned as an optax schedule of the update count (which optax counts from 0).
    """

    def schedule(count: jax.Array) -> jax.Array:
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def peak_scale(d_model: int, warmup_steps: int, peak_learning_rate: float) -> float:
    """The `scale` of `paper_learning_rate` whose schedule peaks at `peak_learning_rate` (after warmup_steps):
    the paper's warm-up and inverse-square-root decay, which is fairseq's inverse_sqrt schedule."""
    return peak_learning_rate * d_model**0.5 * warmup_steps**0.5


def paper_optimizer(
    schedule: Callable[[jax.Array], jax.Array],
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    grad_clip_norm: float | None = None,
) -> optax.GradientTransformation:
    """Adam(β1=0.9, β2=0.98, ε=1e-9) with the given schedule, optionally after global-norm clipping."""
    adam = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    if grad_clip_norm:
        return optax.chain(optax.clip_by_global_norm(grad_clip_norm), adam)
    return adam
