"""Run metrics: one JSON object per line in `<workdir>/metrics.jsonl`, TensorBoard event files and, when
training.wandb_project names one, a Weights & Biases run.

metrics.jsonl holds only what a rerun with the same seed reproduces bit for bit (loss, learning rate,
dev metrics, ...). Wall-clock figures (tokens per second, seconds per step) go to TensorBoard and to
`<workdir>/timing.jsonl` instead, so two runs of the same config give byte-identical metrics.jsonl.

Every write happens in the calling thread, so a write the storage refuses (a full disk) is an OSError
there, naming the file, and leaves no part of a line behind (base.files.append_text). The logs are read
back by base/log_records.py; the TensorBoard event files are base/tensorboard.py's.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from typing import Any, Mapping

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import append_text, exists, make_dirs, read_bytes, write_atomically
from transformer_jax.base.log_records import read_records
from transformer_jax.base.tensorboard import ScalarEvents


class WandbRun:
    """The same scalars logged to a Weights & Biases run of `project` (its files under `<workdir>/wandb` for a local
    workdir). Its id is kept in `<workdir>/wandb_run_id`, so a resumed run logs on to the same W&B run; W&B drops
    values for steps it already holds (those an interrupted attempt logged after its last checkpoint)."""

    def __init__(self, workdir: str, project: str, config: Mapping[str, Any]) -> None:
        import wandb  # the wandb extra: check_run_config has said so when it is missing
        id_path = layout.run_path(workdir, layout.WANDB_RUN_ID)
        if not exists(id_path):
            write_atomically(id_path, uuid.uuid4().hex[:16])
        run_id = read_bytes(id_path).decode().strip()
        local = "://" not in workdir
        if local:
            make_dirs(layout.run_path(workdir, layout.WANDB))
        self.run = wandb.init(project=project, id=run_id, resume="allow", config=dict(config),
                              name=os.path.basename(os.path.normpath(workdir)), dir=workdir if local else None)

    def add(self, values: Mapping[str, float], step: int) -> None:
        self.run.log(dict(values), step=int(step))

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """Appends {"step": s, "split": ..., metric: value} lines and TensorBoard scalars.

    Only the process given `enabled=True` (process 0) writes, so several hosts don't duplicate logs.
    On resume, lines for steps after the restored checkpoint are dropped first (from metrics.jsonl,
    timing.jsonl and TensorBoard), so the logs read as if the run had never been interrupted.
    """

    def __init__(self, workdir: str, enabled: bool = True, resume_step: int = 0, wandb_project: str = "",
                 run_config: Mapping[str, Any] | None = None) -> None:
        self.enabled = enabled
        self.path = layout.run_path(workdir, layout.METRICS)
        self.timing_path = layout.run_path(workdir, layout.TIMING)
        self._events: ScalarEvents | None = None
        self._wandb: WandbRun | None = None
        if not enabled:
            return
        if resume_step > 0 and not exists(self.path):
            logging.warning("%s is missing: the records of steps 1 to %d are lost (restore the file to keep them); "
                            "the log goes on from step %d", self.path, resume_step, resume_step + 1)
        for path in (self.path, self.timing_path):
            _truncate_after(path, resume_step)
        # purge_step drops events an earlier attempt logged after the restored step (or after step 0).
        self._events = ScalarEvents(workdir, purge_step=resume_step + 1)
        if wandb_project:
            self._wandb = WandbRun(workdir, wandb_project, run_config or {})

    def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` of `split` ("train", "dev", "test") at `step`."""
        if not self.enabled:
            return
        values = {key: float(value) for key, value in metrics.items()}
        _append_record(self.path, {"step": int(step), "split": split, **values})
        self._add_scalars(split, values, step)

    def write_timing(self, step: int, timing: Mapping[str, float]) -> None:
        """Record wall-clock figures (not reproducible) in timing.jsonl and TensorBoard's `timing/`.

        The JSON record also holds `time`, the Unix time it was written (TensorBoard's events carry their own),
        so a run's progress can be read against the clock: the step reached after N minutes.
        """
        if not self.enabled:
            return
        values = {key: value if isinstance(value, int) else float(value) for key, value in timing.items()}  # a step
        _append_record(self.timing_path, {"step": int(step), **values, "time": round(time.time(), 3)})
        self._add_scalars("timing", values, step)

    def _add_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        tagged = {f"{prefix}/{key}": value for key, value in values.items()}
        self._events.add(tagged, step)
        if self._wandb is not None:
            self._wandb.add(tagged, step)

    def close(self) -> None:
        """Flush and close the TensorBoard event file (and let it go: tensorboardX's gs:// writer uploads again
        when it is collected, which must happen while the store is reachable, not at interpreter exit)."""
        if self._events is not None:
            events, self._events = self._events, None
            events.close()
        if self._wandb is not None:
            wandb_run, self._wandb = self._wandb, None
            wandb_run.close()


def _append_record(path: str, record: Mapping[str, Any]) -> None:
    # One write of a whole line: a crash leaves at most a cut-short last line, which readers skip.
    append_text(path, json.dumps(record) + "\n")


def _truncate_after(path: str, step: int) -> None:
    """Keep only the complete records of `path` up to `step` (a resumed run rewrites the rest)."""
    if exists(path):
        kept = [json.dumps(r) + "\n" for r in read_records(path) if r["step"] <= step]
        write_atomically(path, "".join(kept))
