"""Preemption: SIGTERM/SIGINT set a flag; every process stops at the same step with a checkpoint."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


@dataclasses.dataclass
class StopFlag:
    """Set by SIGTERM/SIGINT so the loop saves a checkpoint and exits at the next step boundary."""

    signal_number: int | None = None
    previous: dict[int, Any] = dataclasses.field(default_factory=dict)

    def install(self) -> None:
        """Route SIGTERM and SIGINT to this flag (a second signal gets the previous handling back)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Give SIGTERM and SIGINT back to the handlers they had before `install`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signal_number: int, frame: Any) -> None:
        self.signal_number = signal_number
        self.uninstall()

    def agreed(self) -> bool:
        """True when any process was signalled (all processes must stop at the same step)."""
        stop = self.signal_number is not None
        if jax.process_count() == 1:
            return stop
        return bool(np.any(multihost_utils.process_allgather(np.array(stop))))
