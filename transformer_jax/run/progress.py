"""The progress bar: it counts completed steps, not dispatched ones, and its ETA follows a smoothed step rate.

JAX returns from a jitted step as soon as it is dispatched, so a bar advanced on dispatch races ahead
and then stalls wherever the loop waits (a log step's fetch, a checkpoint). Here each dispatched step
leaves its metrics; a step counts as done once they are ready (`jax.Array.is_ready()`, which does not
wait), checked whenever another step is dispatched and at every log step. The rate is an exponential
moving average of (steps, seconds) between completions, from which the ETA follows; intervals that
hold compiling (up to the first completion after the loop starts) or evaluating and saving (up to
`resume`) are left out of it.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, Callable, Protocol

from tqdm import tqdm

from transformer_jax.base.console import plain_lines


class Completable(Protocol):
    """Something that says, without waiting, whether the computation behind it has finished (a jax.Array)."""

    def is_ready(self) -> bool: ...


class _RateBar(tqdm):
    """tqdm whose rate (and hence remaining time) is the one StepProgress measures; "?" until there is one."""

    steps_per_second: float | None = None
    # tqdm's own layout, without the rate and remaining time it would otherwise estimate from elapsed time.
    UNKNOWN_RATE = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<?, ?{unit}/s{postfix}]"

    @property
    def format_dict(self) -> dict[str, Any]:
        values = super().format_dict
        values["rate"] = self.steps_per_second
        if self.steps_per_second is None:
            values["bar_format"] = self.UNKNOWN_RATE
        return values


def _duration(seconds: float) -> str:
    """H:MM:SS (days as D-H:MM:SS)."""
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    return f"{days}-{hour}:{minute:02d}:{second:02d}" if days else f"{hour}:{minute:02d}:{second:02d}"


class StepProgress:
    """A tqdm bar over training steps that advances when steps complete; on a stream that is not a terminal, one
    plain line per log window instead (step, loss, learning rate, tokens/s, rate and ETA), as fairseq does."""

    def __init__(self, total: int, initial: int, enabled: bool, smoothing: float = 0.1,
                 clock: Callable[[], float] = time.perf_counter, plain: bool | None = None) -> None:
        """A bar from step `initial` to `total`, shown only when `enabled` (process 0).

        `smoothing` is the weight of the newest interval in the moving averages (tqdm's convention). `plain`: lines
        instead of the bar (default: when standard error is not a terminal, plain_lines).
        """
        self.plain = enabled and (plain_lines() if plain is None else plain)
        self.total, self.count = total, initial
        self.bar = _RateBar(total=total, initial=initial, disable=not enabled or self.plain, desc="train",
                            unit="step", dynamic_ncols=True)
        self.smoothing, self.clock = smoothing, clock
        self.pending: deque[Completable] = deque()
        self.mean_steps = self.mean_seconds = 0.0  # exponential moving averages of one interval
        self.last_completion: float | None = None  # None until the first completion: that interval compiles

    def dispatched(self, marker: Completable) -> None:
        """Note one more dispatched step, whose `marker` becomes ready when it completes; count finished ones."""
        self.pending.append(marker)
        self.poll()

    def poll(self) -> int:
        """Count the steps that have completed since the last call (in dispatch order); returns how many."""
        done = self._pop_ready()
        if done:
            self._completed(done, measured=self.last_completion is not None)
        return done

    def resume(self) -> None:
        """Training goes on after a pause (evaluating, saving): count what finished, time the rate from now."""
        self._completed(self._pop_ready(), measured=False)

    def set_postfix(self, **values: str) -> None:
        """Show `values` (loss, tokens per second, learning rate) after the bar, or as one plain line."""
        if not self.plain:
            self.bar.set_postfix(values, refresh=True)
            return
        rate = self.steps_per_second
        eta = (_duration((self.total - self.count) / rate) if rate else "?")
        fields = " | ".join(f"{key} {value}" for key, value in values.items())
        print(f"train step {self.count}/{self.total} | {fields} | {f'{rate:.2f}' if rate else '?'} step/s | "
              f"ETA {eta}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()

    @property
    def steps_per_second(self) -> float | None:
        """The smoothed rate of completed steps; None before two completions outside pauses."""
        return self.bar.steps_per_second

    def _pop_ready(self) -> int:
        done = 0
        while self.pending and self.pending[0].is_ready():
            self.pending.popleft()
            done += 1
        return done

    def _completed(self, steps: int, measured: bool) -> None:
        """Advance the bar by `steps`; when `measured`, the interval since the last completion joins the rate."""
        now = self.clock()
        if measured:
            keep = 1.0 - self.smoothing
            self.mean_steps = keep * self.mean_steps + self.smoothing * steps
            self.mean_seconds = keep * self.mean_seconds + self.smoothing * (now - self.last_completion)
            # Both averages start at 0 and so carry the same bias, which cancels in their ratio.
            self.bar.steps_per_second = self.mean_steps / self.mean_seconds if self.mean_seconds > 0 else None
        self.last_completion = now
        if steps:
            self.count += steps
            self.bar.update(steps)
