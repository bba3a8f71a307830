"""Preemption: SIGTERM/SIGINT set a flag; every process stops at the same step with a checkpoint, soon.

A stop waits for every update the host has dispatched: its checkpoint is of the state they end in. JAX dispatches
asynchronously, so, unbounded, the host runs as far ahead of the devices as it is let (up to a whole log window,
the next place it reads a result), and a stop waits for all of that. `StopAgreement` bounds the lead: after each
update the host waits until at most `in_flight` - 1 updates are unfinished, so with the one it dispatches next at
most `in_flight` (training.max_updates_in_flight, K) are dispatched and not finished. While the host is faster
than the devices, K = 2 keeps their queue full (one update runs while the next waits); a stop then waits for at
most K updates (one process) or 2K - 1 (several: the agreement below is read K - 1 updates after it starts),
then the checkpoint's write.

With several processes a signal reaches one host (a preempted TPU VM, a SLURM job step), yet all of
them must stop at the same step or the others hang in the next collective. After each update every
process starts an any-reduction of its flag over the mesh, made to depend on the update's loss so that it is
ready only once that update is; the host reads it K - 1 updates later, which is the bound's wait itself. Every
process reads the same value, so all stop at the same step. An evaluation asks between its batches
(`between_batches`), so a stop abandons it instead of finishing it first.

Ours on every platform, TPU included, rather than the runtime's preemption sync point
(`multihost_utils.reached_preemption_sync_point`, which Orbax's `reached_preemption` asks): in jax/jaxlib
0.10 that sync point is driven by SIGTERM alone (the coordination service's only notifier is a SIGTERM
handler polled once a second; no TPU maintenance-event source), so it hears nothing ours does not, and its
C++ handler, installed by `jax.distributed.initialize`, replaces Python's for good: a SIGTERM during
start-up, data preparation, compiling or the final translation would be swallowed instead of stopping
the run cleanly. `cli.initialize_distributed` therefore turns JAX's preemption service off.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.base.console import say
from transformer_jax.base.sharding import batch_sharding


@dataclasses.dataclass
class StopFlag:
    """Set by SIGTERM/SIGINT so the loop saves a checkpoint and exits at a step boundary.

    It stays installed until the loop has finished its saves: a later signal (a scheduler's repeated SIGTERM, a
    second Ctrl-C) is told that the checkpoint is being finished and does not cut it short, so a stop always
    ends with the checkpoint it promised. SIGQUIT (Ctrl-\\) or SIGKILL stop at once, abandoning it.
    """

    signal_number: int | None = None
    previous: dict[int, Any] = dataclasses.field(default_factory=dict)
    signals: int = 0  # received since install
    step: int = 0  # the step the loop is at (the updates it has dispatched), kept current by the loop
    arrived: float | None = None  # time.perf_counter() when the stop became known here (the first signal)
    arrived_step: int | None = None  # `step` then

    def install(self) -> None:
        """Route SIGTERM and SIGINT to this flag."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Give SIGTERM and SIGINT back to the handlers they had before `install`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signal_number: int, frame: Any) -> None:
        self.signals += 1
        if self.signal_number is None:
            self.signal_number = signal_number
            self.note_arrival()
        else:
            say(f"signal {signal_number} again: stopping after the checkpoint is written (SIGQUIT, Ctrl-\\, stops at "
                "once without it)")

    @property
    def raised(self) -> bool:
        """True once this process received SIGTERM or SIGINT."""
        return self.signal_number is not None

    def note_arrival(self) -> None:
        """Record now, and the loop's step, as when the stop became known (first call only): the signal here, or
        the agreement on a process that another's signal stops."""
        if self.arrived is None:
            self.arrived, self.arrived_step = time.perf_counter(), self.step


class EvaluationAbandoned(Exception):
    """Raised between an evaluation's batches when the run stops: the evaluation is redone after the restart."""


class StopAgreement:
    """Whether every process must stop now, the same answer on every process; and the bound on the host's lead.

    `after_update(done)` after each update's dispatch (`done`: a small output of it, its loss) waits until at most
    `in_flight` - 1 updates are unfinished, then answers; `between_batches()` answers during an evaluation.
    One process: its own flag. Several: an any-reduction of all flags over `mesh`, started after each
    update and read `in_flight` - 1 updates later (see the module docstring), without a blocking exchange
    between hosts beyond the bound's own wait.
    """

    def __init__(self, flag: StopFlag, mesh: jax.sharding.Mesh, in_flight: int = 2,
                 collective: bool | None = None) -> None:
        """`collective` forces the agreement on or off (default: on when there are several processes)."""
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self.flag, self.in_flight = flag, in_flight
        self.collective = jax.process_count() > 1 if collective is None else collective
        # The last updates' markers, oldest first: their `done` outputs, or (several processes) the agreements
        # started after them, each ready once its update is.
        self._unread: collections.deque[jax.Array] = collections.deque()
        self.waited = 0.0  # seconds the host has waited in the bound since the caller last took them (`take_wait`)
        if not self.collective:
            return
        # Both possible inputs are placed once: a check then costs one small dispatch, no host-to-device copy.
        sharding = batch_sharding(mesh)
        local = len(sharding.addressable_devices)
        self._inputs = {
            value: jax.make_array_from_process_local_data(sharding, np.full(local, value), (mesh.size,))
            for value in (False, True)
        }
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        # `done > inf` is never true (nor for NaN) but makes the answer wait for the update, on every backend.
        self._after = jax.jit(lambda flags, done: jnp.any(flags) | (done > jnp.inf), out_shardings=replicated)
        self._now = jax.jit(jnp.any, out_shardings=replicated)

    def after_update(self, done: jax.Array) -> bool:
        """Called once an update is dispatched (`done`: a scalar it outputs): True when all processes stop at this
        step. Returns once at most `in_flight` - 1 dispatched updates are unfinished."""
        self._unread.append(self._after(self._inputs[self.flag.raised], done) if self.collective else done)
        stop = False
        started = time.perf_counter()
        while len(self._unread) >= self.in_flight:
            stop |= self._read(self._unread.popleft())
        self.waited += time.perf_counter() - started
        return stop if self.collective else self.flag.raised

    def between_batches(self) -> bool:
        """During an evaluation: True when all processes abandon it and stop. Several processes read every pending
        agreement and one started now (so all of them ask as often, in the same order)."""
        if not self.collective:
            return self.flag.raised
        self._unread.append(self._now(self._inputs[self.flag.raised]))
        stop = False
        while self._unread:
            stop |= self._read(self._unread.popleft())
        return stop

    def take_wait(self) -> float:
        """The seconds the host waited in the bound since the last call (the window's `lead_wait_seconds`)."""
        waited, self.waited = self.waited, 0.0
        return waited

    def _read(self, marker: jax.Array) -> bool:
        """Wait for `marker`; the agreement it holds (several processes), else False."""
        if not self.collective:
            marker.block_until_ready()
            return False
        # Replicated: this process's own copy holds the agreed value, read without a collective.
        return bool(np.asarray(marker.addressable_data(0)))


def updates_at_stop(in_flight: int, processes: int) -> int:
    """The most updates a stop waits for after its signal with `in_flight` updates dispatched and unfinished: those
    (one process), or those and the `in_flight` - 1 more dispatched before the agreement is read (several)."""
    return in_flight if processes == 1 else 2 * in_flight - 1


def grace_problem(grace_seconds: float, in_flight: int, processes: int, seconds_per_update: float,
                  write_seconds: float, directory: str) -> tuple[float, str | None]:
    """The seconds a stop is estimated to take (the updates it waits for, then a checkpoint write timed at
    `write_seconds` to `directory`), and the line saying it cannot fit `grace_seconds` and what to change (None:
    it fits, or `grace_seconds` is 0: no check)."""
    updates = updates_at_stop(in_flight, processes)
    estimate = updates * seconds_per_update + write_seconds
    if not grace_seconds or estimate <= grace_seconds:
        return estimate, None
    fixes = []
    if in_flight > 1:
        fewer = updates_at_stop(1, processes) * seconds_per_update + write_seconds
        fixes.append(f"lower --config.training.max_updates_in_flight (1 would stop in about {fewer:.0f} s)")
    if write_seconds >= grace_seconds:
        fixes.append("the checkpoint write alone took longer than the grace period, so no setting of this run fits "
                     "it: write the run to faster storage (a bucket in the hosts' region, a local disk)")
    elif write_seconds > seconds_per_update * updates:
        fixes.append("write the run to faster storage (a bucket in the hosts' region, a local disk)")
    fixes.append("or give the run a longer grace period (the scheduler's, e.g. terminationGracePeriodSeconds) and "
                 "set --config.training.stop_grace_seconds to it")
    return estimate, (
        f"a stop may not fit its grace period: after SIGTERM the run waits for up to {updates} updates in flight "
        f"({seconds_per_update:.2f} s each) and writes a checkpoint ({write_seconds:.1f} s to {directory}): about "
        f"{estimate:.0f} s, more than training.stop_grace_seconds={grace_seconds:g}; " + "; ".join(fixes))
