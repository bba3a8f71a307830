"""One optimizer update at a time, on the programs of an assembled run (`assemble_run`, assembly.py).

`UpdateRunner` holds the train state (made when first needed: a resumed run's is its checkpoint's), reads the training
batches ahead in the background (`prefetch`) and places them on the mesh, dispatches one update from its micro-batches
(the train step, or gradients accumulated and applied) and compiles the update for every batch shape before the first
step. The `Trainer` (loop.py) extends it with the loop: logs, evaluations, checkpoints, stops and failures.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax

from transformer_jax.base.sharding import global_batch
from transformer_jax.run.assembly import TrainingRun
from transformer_jax.run.prefetch import Prefetcher
from transformer_jax.training.state import TrainState


class UpdateRunner:
    """Runs the updates of an assembled run, one at a time: `update()` applies the next one."""

    def __init__(self, run: TrainingRun) -> None:
        self.config, self.mesh, self.data, self.programs = run.config, run.mesh, run.data, run.programs
        self.shardings = self.programs.shardings
        self.programs.check_state_fits()
        self._state: TrainState | None = None  # made when first needed: a resumed run's is the checkpoint's
        self.micro_steps = self.programs.micro_steps()
        self.input: Prefetcher | None = None  # started by the first update (after a resume sets the position)
        self.step_host = (0.0, 0.0)  # the last update's host seconds: (getting its batches, dispatching it)
        self.running = ""  # what was last dispatched (a program, a restore): the one a device failure names

    @property
    def state(self) -> TrainState:
        """The train state: the newest checkpoint's once restored, else the initial one, made when first asked for
        (a run that resumes never makes it: no initialising program is compiled or run)."""
        if self._state is None:
            self._state = self.programs.init_state()
        return self._state

    @state.setter
    def state(self, state: TrainState) -> None:
        self._state = state

    def update(self) -> dict[str, jax.Array]:
        """One optimizer update from `accumulation_steps` micro-batches; returns its metrics (on device).

        Runs under a transfer guard: the batches' copy to the devices is the one transfer of a step;
        anything else crossing between host and device (a Python scalar or NumPy array passed to a
        jitted step, a value read back) raises an error.
        """
        accumulation = self.config.training.accumulation_steps
        with jax.transfer_guard("disallow"):
            started = time.perf_counter()
            batches = [self._next_global_batch() for _ in range(accumulation)]
            fetched = time.perf_counter()
            metrics = self._dispatch(batches)
            self.step_host = (fetched - started, time.perf_counter() - fetched)
            return metrics

    def _dispatch(self, batches: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
        """Dispatch one update on `batches` (its micro-batches) and return its metrics (on device)."""
        programs = self.programs
        if len(batches) == 1:
            self.running = "train_step"
            self.state, metrics = programs.train_step(self.state, batches[0])
            return metrics
        self.running = "micro_gradients"
        grads, sums = programs.micro_gradients(self.state, batches[0], self.micro_steps[0])
        for index, batch in enumerate(batches[1:], start=1):
            more_grads, more_sums = programs.micro_gradients(self.state, batch, self.micro_steps[index])
            grads, sums = programs.add_trees(grads, more_grads), programs.add_trees(sums, more_sums)
        self.running = "apply_gradients"
        self.state, metrics = programs.apply_gradients(self.state, grads, sums)
        return metrics

    def _next_global_batch(self) -> dict[str, jax.Array]:
        """The next batch on the mesh: built and placed `data.prefetch_batches` ahead in the background (0:
        built here, between steps)."""
        depth = self.config.data.get("prefetch_batches", 0)
        if not depth:
            return self._place(next(self.data.train))
        if self.input is None:
            self.input = Prefetcher(self.data.train, self._place, depth)
        return next(self.input)

    def _place(self, local: dict[str, Any]) -> dict[str, jax.Array]:
        """This process's rows placed on the mesh: the intended host-to-device copy, allowed by name.

        (With several processes the placement uses make_array_from_process_local_data, which the
        transfer guard counts as implicit.)
        """
        with jax.transfer_guard_host_to_device("allow"):
            return global_batch(local, self.mesh)

    def input_state(self) -> dict[str, Any]:
        """The training iterator's position after the last batch a step consumed (what a checkpoint records)."""
        return self.input.state() if self.input is not None else self.data.train.get_state()

    def stop_input(self) -> None:
        """Stop reading ahead; the iterator is left after the last batch a step consumed."""
        if self.input is not None:
            self.input.close()
            self.data.train.set_state(self.input.state())
            self.input = None

    def compile_steps(self) -> list[tuple[int, int]]:
        """Compile the update for every batch shape of the training data, before the first step; returns them.

        A shape first met mid-run would be compiled then, each process at its own pace, while the others
        wait for it in the step's collectives (which time out on a loaded host).
        """
        start = time.perf_counter()
        self.programs.compile_train(self.state, self.micro_steps[0])  # each checked to fit the devices
        shapes = list(self.programs.shapes.train)
        logging.info("compiled the train step for batches of %s (rows x tokens) in %.1f s",
                     ", ".join(f"{rows}x{length}" for rows, length in shapes), time.perf_counter() - start)
        return shapes
