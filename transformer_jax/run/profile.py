"""A profile of a few updates: a `jax.profiler` trace into `<workdir>/profile/` (`training.profile_steps`).

As Flax's `periodic_actions.Profile` and MaxText's `profiler: xplane` do: the trace starts before the update
`training.profile_skip_steps` after the first one of each start or resume (compiling and the first updates'
warm-up are not what a profile is for), covers `training.profile_steps` updates, each marked as a step
(`StepTraceAnnotation`, the step views of TensorBoard's profile plugin and XProf group by it), and stops once
the devices have finished them. JAX writes each trace into its own folder below `profile/`: an XSpace
(`*.xplane.pb`, for TensorBoard or XProf) and a Perfetto/Chrome trace JSON (`perfetto_trace.json.gz`,
ui.perfetto.dev), which `trace_summary` reads.

The profile serves a diagnosis, never the run: a profiler that cannot start or write (another trace running,
a storage that refuses it) costs a warning, not the training. Only the first process traces.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

import jax

from transformer_jax.base.console import say

# The name of each traced update's step marker (what trace_summary counts as one update).
STEP_NAME = "train"


class UpdateProfile:
    """Traces updates `first` to `first + steps - 1` (0-based: the updates done before each) into `directory`."""

    def __init__(self, directory: str, first: int, steps: int, enabled: bool = True) -> None:
        self.directory, self.first, self.steps = directory, first, steps if enabled else 0
        self.tracing = False

    @contextlib.contextmanager
    def update(self, step: int, outputs: Callable[[], Any]) -> Iterator[None]:
        """Around the update that follows `step` updates: before the first one traced, waits for `outputs()` (what
        the updates compute) on the devices and starts the trace; marks each traced one as a step; after the last,
        waits for `outputs()` again and stops the trace. So the trace holds the traced updates' work, and only it."""
        if self.steps and step == self.first:
            # Updates dispatched ahead of the devices would run inside the trace as if they were traced ones.
            jax.block_until_ready(outputs())
            self._start()
        if not self.tracing:
            yield
            return
        with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step + 1):
            yield
        if step + 1 >= self.first + self.steps:
            jax.block_until_ready(outputs())  # the devices' part of the last update belongs to the trace
            self.stop(f"updates {self.first + 1}-{step + 1}")

    def _start(self) -> None:
        try:
            try:
                jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
            except TypeError:  # a JAX without the option: trace_summary reads the trace viewer's JSON instead
                jax.profiler.start_trace(self.directory)
        except Exception as error:  # noqa: BLE001 - see the module docstring
            logging.warning("the profiler did not start (%s); training goes on without a profile", error)
            return
        self.tracing = True

    def stop(self, what: str = "the updates traced") -> None:
        """Stop the trace (when one runs) and say where it went."""
        if not self.tracing:
            return
        self.tracing = False
        try:
            jax.profiler.stop_trace()
        except Exception as error:  # noqa: BLE001 - see the module docstring
            logging.warning("the profile of %s was not written (%s)", what, error)
            return
        say(f"profile of {what}: {self.directory} (TensorBoard's profile plugin, XProf or ui.perfetto.dev)")
