"""The host's side of a step: how long one host process takes to build its share of an update's batches.

The roofline says how fast the chips could take updates; a host that cannot build its rows of the next
batch in that time leaves them waiting, whatever the background prefetch (it only overlaps the two).
Measured here, on this machine, in one thread, on the run's own corpus and batch plan, for the share of
the rows one process of the topology reads (the rows are dealt out to the hosts in blocks).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from transformer_jax.data.batching import BatchIterator

# Batches timed after one untimed batch (the first plans the epoch).
TIMED_BATCHES = 20


@dataclasses.dataclass(frozen=True)
class HostInput:
    """Seconds one host process takes to build its share of one update, and for how many processes."""

    seconds_per_update: float
    processes: int

    def line(self, step_seconds: float) -> str:
        """The report's line: the time against the roofline, and whether input would hold the chips back."""
        ahead = step_seconds / self.seconds_per_update if self.seconds_per_update else float("inf")
        measured = (f"{self.seconds_per_update * 1e3:.2f} ms per update to build one of {self.processes} host "
                    f"processes' rows (this machine, one thread) against the roofline's {step_seconds * 1e3:.1f} ms: "
                    f"input {ahead:.1f}x as fast as the chips")
        if ahead < 1:
            return (f"{measured}; input would be the bottleneck: use hosts with faster cores, more processes per "
                    f"batch (rows dealt to each), or larger updates (data.tokens_per_batch, accumulation)")
        if ahead < 3:
            return f"{measured}; little headroom: a slower host core or a busy host would hold the chips back"
        return f"{measured}; the background prefetch keeps input ahead"


def host_input(train: BatchIterator, processes: int, accumulation: int,
               batches: int = TIMED_BATCHES) -> HostInput:
    """Time building process 0's rows of `batches` batches of `train`'s plan when `processes` share them."""
    shard = train.for_process(0, processes)
    next(shard)  # plans the epoch: paid once per epoch, not per update
    seconds = []
    for _ in range(batches):
        start = time.perf_counter()
        next(shard)
        seconds.append(time.perf_counter() - start)
    return HostInput(float(np.median(seconds)) * accumulation, processes)
