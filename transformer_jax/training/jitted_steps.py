"""The step functions of one run, jitted with the shardings of its mesh and state."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Callable

import jax
import numpy as np

from transformer_jax.run.sharding import batch_sharding
from transformer_jax.training.state import TrainState
from transformer_jax.training.step import (
    add_trees,
    apply_gradients,
    compute_gradients,
    eval_step,
    train_step,
)


@dataclasses.dataclass(frozen=True)
class JittedSteps:
    """What `Trainer.update` and the dev evaluation call: jitted steps and the micro-step indices."""

    train_step: Callable  # (state, batch) -> (state, metrics); donates the state
    micro_gradients: Callable  # (state, batch, micro_step) -> (grad sums, metric sums)
    apply_gradients: Callable  # (state, grad sums, metric sums) -> (state, metrics); donates the state
    add_trees: Callable  # (a, b) -> a + b; donates a
    eval_step: Callable  # (params, batch split over the batch axes) -> metric sums
    # Micro-step indices live on the devices once, so update() passes no Python scalars to jit.
    micro_steps: list[jax.Array]


def jit_steps(
    mesh: jax.sharding.Mesh,
    shardings: TrainState,
    apply_fn: Callable[..., Any],
    smoothing: float,
    accumulation_steps: int,
    place_micro_steps: bool = True,
) -> JittedSteps:
    """Jit the train, accumulation and eval steps for `mesh`, the state laid out as `shardings`.

    `place_micro_steps=False` leaves `micro_steps` empty: compile-only devices (transformer_jax.aot)
    hold no data.
    """
    batch = batch_sharding(mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def micro_gradients(state: TrainState, b: dict[str, jax.Array], micro_step: jax.Array) -> tuple[Any, Any]:
        return compute_gradients(state, b, smoothing, micro_step)

    return JittedSteps(
        train_step=jax.jit(  # a partial, not a lambda: compile logs and events name it train_step
            functools.partial(train_step, smoothing=smoothing),
            in_shardings=(shardings, batch), out_shardings=(shardings, None), donate_argnums=0,
        ),
        micro_gradients=jax.jit(
            micro_gradients,
            in_shardings=(shardings, batch, None), out_shardings=(shardings.params, None),
        ),
        apply_gradients=jax.jit(
            apply_gradients, in_shardings=(shardings, shardings.params, None),
            out_shardings=(shardings, None), donate_argnums=0,
        ),
        add_trees=jax.jit(add_trees, donate_argnums=0),
        # Laid out by its arguments: params with the state's shardings and a batch split over the batch
        # axes (evaluate_loss with the mesh) make each device compute its own rows, the sums added
        # across devices. No in_shardings, so a caller still passing whole NumPy batches keeps working:
        # with several processes jit refuses NumPy inputs given a split sharding.
        eval_step=jax.jit(lambda params, b: eval_step(params, apply_fn, b, smoothing)),
        micro_steps=[jax.device_put(np.int32(i), replicated) for i in range(accumulation_steps)]
        if place_micro_steps else [],
    )


def compile_batch_shapes(jitted: JittedSteps, state: TrainState, mesh: jax.sharding.Mesh,
                         shapes: Sequence[tuple[int, int]], keys: Sequence[str], accumulation_steps: int) -> None:
    """Compile the step that reads a batch (the train step, or the micro-step's gradients) for every
    global (rows, length) batch shape, its arrays `keys` int32 and split over the mesh's batch axes.

    jit keeps these executables: the first batch of each shape then runs without compiling.
    """
    sharding = batch_sharding(mesh)
    for rows, length in shapes:
        batch = {key: jax.ShapeDtypeStruct((rows, length), np.int32, sharding=sharding) for key in keys}
        if accumulation_steps == 1:
            jitted.train_step.lower(state, batch).compile()
        else:
            jitted.micro_gradients.lower(state, batch, jitted.micro_steps[0]).compile()
