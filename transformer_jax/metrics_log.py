"""Run metrics: one JSON object per line in `<workdir>/metrics.jsonl` and TensorBoard event files."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping


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

        self._writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        temporary = self.path + ".tmp"
        with open(temporary, "w") as f:
            f.writelines(kept)
        os.replace(temporary, self.path)

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


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """All records of `<workdir>/metrics.jsonl`, in order."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]
