"""Preemption: SIGTERM/SIGINT set a flag; every process stops at the same step with a checkpoint.

With several processes a signal reaches one host (a preempted TPU VM, a SLURM job step), yet all of
them must stop at the same step or the others hang in the next collective. Every step each process
starts an any-reduction of its flag over the mesh and reads the previous step's result. Devices run
programs in the order they were dispatched, so that result is ready once the previous update is:
the host waits for it while the devices already run the current update (the host stays one step
ahead instead of stalling), and every process reads the same value, so all stop at the same step.

Ours on every platform, TPU included, rather than the runtime's preemption sync point
(`multihost_utils.reached_preemption_sync_point`, which Orbax's `reached_preemption` asks): in jax/jaxlib
0.10 that sync point is driven by SIGTERM alone (the coordination service's only notifier is a SIGTERM
handler polled once a second; no TPU maintenance-event source), so it hears nothing ours does not, and its
C++ handler, installed by `jax.distributed.initialize`, replaces Python's for good: a SIGTERM during
start-up, data preparation, compiling or the final translation would be swallowed instead of stopping
the run cleanly. `cli.initialize_distributed` therefore turns JAX's preemption service off.
"""

from __future__ import annotations

import dataclasses
import signal
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
        else:
            say(f"signal {signal_number} again: stopping after the checkpoint is written (SIGQUIT, Ctrl-\\, stops at "
                "once without it)")

    @property
    def raised(self) -> bool:
        """True once this process received SIGTERM or SIGINT."""
        return self.signal_number is not None


class StopAgreement:
    """Whether every process must stop now: asked once per step, the same answer on every process.

    One process: its own flag. Several: an any-reduction of all flags over `mesh`, started at this
    step and read at the next, so the processes stop one or two steps after the first signal,
    all at the same step, without a blocking exchange between hosts.
    """

    def __init__(self, flag: StopFlag, mesh: jax.sharding.Mesh, collective: bool | None = None) -> None:
        """`collective` forces the agreement on or off (default: on when there are several processes)."""
        self.flag = flag
        self.collective = jax.process_count() > 1 if collective is None else collective
        self._pending: jax.Array | None = None
        if not self.collective:
            return
        # Both possible inputs are placed once: a step then costs one small dispatch, no host-to-device copy.
        sharding = batch_sharding(mesh)
        local = len(sharding.addressable_devices)
        self._inputs = {
            value: jax.make_array_from_process_local_data(sharding, np.full(local, value), (mesh.size,))
            for value in (False, True)
        }
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self._any = jax.jit(jnp.any, out_shardings=replicated)

    def __call__(self) -> bool:
        """True when all processes stop at this step (some process was signalled a step or more ago)."""
        if not self.collective:
            return self.flag.raised
        previous, self._pending = self._pending, self._any(self._inputs[self.flag.raised])
        # Replicated: this process's own copy holds the agreed value, read without a collective.
        return previous is not None and bool(np.asarray(previous.addressable_data(0)))
