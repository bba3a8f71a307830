"""Run metrics: one JSON object per line in `<workdir>/metrics.jsonl` and TensorBoard event files.

metrics.jsonl holds only what a rerun with the same seed reproduces bit for bit (loss, learning rate,
dev metrics, ...). Wall-clock figures (tokens per second, seconds per step) go to TensorBoard and to
`<workdir>/timing.jsonl` instead, so two runs of the same config give byte-identical metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Mapping

from transformer_jax.base.files import append_text, exists, read_text, write_atomically
from transformer_jax.base import workdir as layout


def tensorboard_writer(workdir: str, **kwargs: Any) -> Any:
    """A tensorboardX SummaryWriter on `<workdir>/tensorboard` whose event file no other writer has.

    tensorboardX names event files by the second and the host and opens them with "wb": a second
    writer opened in the same second (eval.py adding two kinds of plots, a quick restart) would
    truncate the first one's file. A per-writer suffix keeps every file.
    """
    from tensorboardX import (
        SummaryWriter,  # imported here: only the writing process needs it
    )

    suffix = f".{os.getpid()}.{uuid.uuid4().hex[:8]}"
    return SummaryWriter(layout.run_path(workdir, layout.TENSORBOARD), filename_suffix=suffix, **kwargs)


class MetricsLog:
    """Appends {"step": s, "split": ..., metric: value} lines and TensorBoard scalars.

    Only the process given `enabled=True` (process 0) writes, so several hosts don't duplicate logs.
    On resume, lines for steps after the restored checkpoint are dropped first (from metrics.jsonl,
    timing.jsonl and TensorBoard), so the logs read as if the run had never been interrupted.
    """

    def __init__(self, workdir: str, enabled: bool = True, resume_step: int = 0) -> None:
        self.enabled = enabled
        self.path = layout.run_path(workdir, layout.METRICS)
        self.timing_path = layout.run_path(workdir, layout.TIMING)
        self._writer = None
        if not enabled:
            return
        for path in (self.path, self.timing_path):
            _truncate_after(path, resume_step)
        # purge_step drops events an earlier attempt logged after the restored step (or after step 0).
        self._writer = tensorboard_writer(workdir, purge_step=resume_step + 1)

    def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` of `split` ("train", "dev", "test") at `step`."""
        if not self.enabled:
            return
        values = {key: float(value) for key, value in metrics.items()}
        _append_record(self.path, {"step": int(step), "split": split, **values})
        self._add_scalars(split, values, step)

    def write_timing(self, step: int, timing: Mapping[str, float]) -> None:
        """Record wall-clock figures (not reproducible) in timing.jsonl and TensorBoard's `timing/`."""
        if not self.enabled:
            return
        values = {key: float(value) for key, value in timing.items()}
        _append_record(self.timing_path, {"step": int(step), **values})
        self._add_scalars("timing", values, step)

    def _add_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self._writer.add_scalar(f"{prefix}/{key}", value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the TensorBoard writer (and let it go: tensorboardX's gs:// writer uploads again
        when it is collected, which must happen while the store is reachable, not at interpreter exit)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _append_record(path: str, record: Mapping[str, Any]) -> None:
    # One write of a whole line: a crash leaves at most a cut-short last line, which readers skip.
    append_text(path, json.dumps(record) + "\n")


def _truncate_after(path: str, step: int) -> None:
    """Keep only the complete records of `path` up to `step` (a resumed run rewrites the rest)."""
    if exists(path):
        kept = [json.dumps(r) + "\n" for r in read_records(path) if r["step"] <= step]
        write_atomically(path, "".join(kept))


def read_records(path: str) -> list[dict[str, Any]]:
    """The complete JSON lines of `path` (a last line cut short by a crash is skipped)."""
    records = []
    for line in read_text(path).splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """All records of `<workdir>/metrics.jsonl`, in order."""
    return read_records(layout.run_path(workdir, layout.METRICS))
