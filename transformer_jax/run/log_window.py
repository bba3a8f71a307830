"""The log window: the steps since the last train log line, summarized into metrics.jsonl, timing.jsonl and the bar."""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np

from transformer_jax.run.metrics_log import MetricsLog
from transformer_jax.run.progress import StepProgress


def summarize_window(fetched: list[dict[str, Any]]) -> dict[str, float]:
    """Token-weighted means of the (fetched) per-step metrics since the last log (no wall-clock figures)."""
    # Python floats throughout, so a window restored from a checkpoint sums exactly like a live one.
    fetched = [{key: float(value) for key, value in m.items()} for m in fetched]
    tokens = np.array([m["tokens"] for m in fetched])
    total = max(tokens.sum(), 1.0)
    mean = lambda key: float(np.sum([m[key] * t for m, t in zip(fetched, tokens)]) / total)
    nll = mean("nll")
    return {
        "loss": mean("loss"),
        "nll": nll,
        "perplexity": float(np.exp(min(nll, 50.0))),
        "accuracy": mean("accuracy"),
        "grad_norm": float(np.mean([m["grad_norm"] for m in fetched])),
        "skipped_updates": float(np.sum([m["update_skipped"] for m in fetched])),
    }


# The host's seconds per log window that the loop measures (window_timing).
HOST_KEYS = ("input_seconds", "dispatch_seconds", "lead_wait_seconds")


# What every step's metrics hold (what summarize_window and window_timing read).
STEP_KEYS = ("loss", "nll", "accuracy", "grad_norm", "update_skipped", "tokens")


def open_window_problem(open_window: object) -> str | None:
    """What makes a checkpoint's saved open window unusable (a damaged record); None: a list of step metrics."""
    if not isinstance(open_window, list):
        return f"open_window is a JSON {type(open_window).__name__}, not a list of step metrics"
    for number, metrics in enumerate(open_window, start=1):
        if not (isinstance(metrics, dict) and all(
                isinstance(metrics.get(key), (int, float)) and not isinstance(metrics.get(key), bool)
                for key in STEP_KEYS)):
            return f"open_window entry {number} is not a step's metrics ({', '.join(STEP_KEYS)})"
    return None


def window_timing(fetched: list[dict[str, Any]], seconds: float, host: dict[str, float] | None = None,
                  sync_seconds: float = 0.0) -> dict[str, float]:
    """Throughput of the log window: target tokens per second and seconds per step (wall clock), and where the
    host spent the window.

    `host` holds the seconds the loop spent getting batches (`input_seconds`: building or waiting for them, and
    placing them), dispatching the steps (`dispatch_seconds`) and waiting for the devices to bound its lead
    (`lead_wait_seconds`: training.max_updates_in_flight); `sync_seconds` is the wait for the window's steps to
    finish when it closes. JAX dispatches asynchronously, so those two waits are the only time the host stood idle
    for the device: `host_share` = (window - waits) / window is the share of the window the host was busy.
    Near 1 the device waited for the host (input, Python, logging); near 0 the host waited for the device.
    """
    tokens = float(np.sum([float(m["tokens"]) for m in fetched]))
    timing = {"tokens_per_second": tokens / max(seconds, 1e-9), "seconds_per_step": seconds / max(len(fetched), 1)}
    if host is not None:
        idle = sync_seconds + host.get("lead_wait_seconds", 0.0)
        timing.update({key: value for key, value in host.items()},
                      sync_seconds=sync_seconds, host_share=min(1.0, max(0.0, 1.0 - idle / max(seconds, 1e-9))))
    return timing


class LogWindow:
    """The per-step metrics since the last log line, when they started, and where they are written.

    `step_metrics` holds the metrics of the open window (on device until it closes); a checkpoint saves
    them, so a resumed run's next log line covers the same steps as an uninterrupted run's.
    """

    def __init__(
        self,
        workdir: str,
        schedule: Callable[[int], jax.Array],
        start: int,
        num_steps: int,
        open_window: list[dict[str, Any]],
        enabled: bool,
        wandb_project: str = "",
        run_config: dict[str, Any] | None = None,
    ) -> None:
        """Resume the log at step `start` of `num_steps` with the window a checkpoint left open.

        `schedule` maps the count of applied updates to the learning rate logged with each window.
        Only the `enabled` process (process 0) writes the log and shows the progress bar; with `wandb_project`,
        it logs to that Weights & Biases project as well (`run_config`: the settings it records).
        """
        self.log = MetricsLog(workdir, enabled=enabled, resume_step=start, wandb_project=wandb_project,
                              run_config=run_config)
        self.progress = StepProgress(num_steps, start, enabled)
        self.schedule = schedule
        self.step_metrics = list(open_window)
        self.started = time.perf_counter()
        self.host = dict.fromkeys(HOST_KEYS, 0.0)  # the loop's own seconds in this window (see window_timing)
        self.seconds_per_step: float | None = None  # of the last window closed (wall clock, its steps alone)

    def add(self, metrics: dict[str, jax.Array], input_seconds: float = 0.0, dispatch_seconds: float = 0.0) -> None:
        """Record the metrics of one more (dispatched) step and the host's seconds getting its batches and
        dispatching it; the bar counts the step once its metrics are ready."""
        self.step_metrics.append(metrics)
        self.host["input_seconds"] += input_seconds
        self.host["dispatch_seconds"] += dispatch_seconds
        self.progress.dispatched(metrics["loss"])

    def waited(self, seconds: float) -> None:
        """Record the host's wait for the devices to bound its lead (`lead_wait_seconds`)."""
        self.host["lead_wait_seconds"] += seconds

    def close(self, step: int, skipped_updates: jax.Array) -> None:
        """Write the window ending at `step` (train metrics, timing, progress bar) and start an empty one."""
        waited = time.perf_counter()
        fetched = jax.device_get(self.step_metrics)  # waits for the window's steps to finish
        sync_seconds = time.perf_counter() - waited
        self.progress.poll()
        timing = window_timing(fetched, time.perf_counter() - self.started, self.host, sync_seconds)
        summary = summarize_window(fetched)
        # Optax counts only applied updates: skipped ones did not advance the schedule.
        skipped = int(jax.device_get(skipped_updates))
        summary["learning_rate"] = float(jax.device_get(self.schedule(step - 1 - skipped)))
        self.log.write(step, "train", summary)
        self.log.write_timing(step, timing)
        self.seconds_per_step = timing["seconds_per_step"]
        self.progress.set_postfix(loss=f"{summary['loss']:.3f}", lr=f"{summary['learning_rate']:.2e}",
                                  tok_s=f"{timing['tokens_per_second']:.0f}")
        self.step_metrics = []
        self.host = dict.fromkeys(HOST_KEYS, 0.0)

    def restart_clock(self) -> None:
        """Time the window from now (evaluating and saving are not training time)."""
        self.started = time.perf_counter()

    def resume_progress(self) -> None:
        """Leave the pause just ended (evaluating, saving) out of the bar's rate."""
        self.progress.resume()

    def finish(self) -> None:
        """Close the progress bar and the metrics log."""
        self.progress.close()
        self.log.close()
