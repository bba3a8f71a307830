"""The train state: parameters, optimizer state, step, dropout key and counts of skipped updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from transformer_jax.model.transformer import Transformer


class TrainState(train_state.TrainState):
    """Parameters, optimizer state and step, the dropout key, and counts of skipped updates."""

    dropout_key: jax.Array = struct.field(default=None)
    skipped_updates: jax.Array = struct.field(default=None)  # in the whole run
    consecutive_skipped: jax.Array = struct.field(default=None)  # since the last finite update
    longest_skip_streak: jax.Array = struct.field(default=None)  # most consecutive skips so far


def create_train_state(
    model: Transformer, optimizer: optax.GradientTransformation, seed: int
) -> TrainState:
    """Initialize parameters (with logical-axis boxes) and the optimizer state from `seed`.

    Pass the same `model` and `optimizer` objects to every call whose results must share a tree
    structure (e.g. `jax.eval_shape` and `jax.jit` of the same initializer).
    """
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    dummy = jnp.ones((1, 8), jnp.int32)
    params = model.init(init_key, dummy, dummy)["params"]
    return TrainState.create(
        apply_fn=model.apply,
        params=params,
        tx=optimizer,
        dropout_key=jax.random.key_data(dropout_key),
        skipped_updates=jnp.zeros((), jnp.int32),
        consecutive_skipped=jnp.zeros((), jnp.int32),
        longest_skip_streak=jnp.zeros((), jnp.int32),
    )
