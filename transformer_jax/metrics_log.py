"""Run metrics: one JSON object per line in `<workdir>/metrics.jsonl` and TensorBoard event files."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from transformer_jax.atomic import write_atomically


class MetricsLog:
    """Appends {"step": s, "split": ..., metric: value} lines and TensorBoard scalars.

    Only the process given `enabled=True` (process 0) writes, so several hosts don't duplicate logs.
    On resume, lines for steps after the restored checkpoint are dropped first, so the file reads as
    if the run had never been interrupted.
    """

    def __init__(self, workdir: str, enabled: bool = True, resume_step: int = 0) -> None:
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._writer = None
        if not enabled:
            return
        self._truncate_after(resume_step)
        from tensorboardX import SummaryWriter  # imported here: only the writing process needs it

        # purge_step drops events a previous attempt logged after the restored step.
        self._writer = SummaryWriter(os.path.join(workdir, "tensorboard"),
                                     purge_step=resume_step + 1 if resume_step else None)

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        kept = [json.dumps(r) + "\n" for r in read_records(self.path) if r["step"] <= step]
        write_atomically(self.path, "".join(kept))

    def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` of `split` ("train", "dev", "test") at `step`."""
        if not self.enabled:
            return
        values = {key: float(value) for key, value in metrics.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": int(step), "split": split, **values}) + "\n")
        for key, value in values.items():
            self._writer.add_scalar(f"{split}/{key}", value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self._writer is not None:
            self._writer.close()


def read_records(path: str) -> list[dict[str, Any]]:
    """The complete JSON lines of `path` (a last line cut short by a crash is skipped)."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """All records of `<workdir>/metrics.jsonl`, in order."""
    return read_records(os.path.join(workdir, "metrics.jsonl"))
