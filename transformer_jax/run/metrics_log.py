"""Run metrics: one JSON object per line in `<workdir>/metrics.jsonl`, TensorBoard event files and, when
training.wandb_project names one, a Weights & Biases run.

metrics.jsonl holds only what a rerun with the same seed reproduces bit for bit (loss, learning rate,
dev metrics, ...). Wall-clock figures (tokens per second, seconds per step) go to TensorBoard and to
`<workdir>/timing.jsonl` instead, so two runs of the same config give byte-identical metrics.jsonl.

Every write happens in the calling thread, so a write the storage refuses (a full disk) is an OSError
there, naming the file, and leaves no part of a line behind (base.files.append_text).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import uuid
from typing import Any, Iterator, Mapping

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import append_text, exists, is_file, make_dirs, read_bytes, write_atomically
from transformer_jax.errors import CheckpointError


def _event_file_suffix() -> str:
    """tensorboardX names event files by the second and the host and opens them with "wb": a second writer opened
    in the same second (eval.py adding two kinds of plots, a quick restart) would truncate the first one's file.
    A per-writer suffix keeps every file."""
    return f".{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _import_tensorboardx() -> None:
    """Import tensorboardX without PyTorch. Its writer module imports torch wherever torch is installed (1.3-2 s of
    a run's start on a 2-core host), only to accept torch tensors, which this project never writes. Where torch is
    not loaded yet, tensorboardX is imported with torch hidden (its own fallback when torch is missing), then torch
    is importable again as before."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        import tensorboardX  # noqa: F401
    finally:
        del sys.modules["torch"]


def tensorboard_writer(workdir: str, **kwargs: Any) -> Any:
    """A tensorboardX SummaryWriter on `<workdir>/tensorboard` whose event file no other writer has (for figures)."""
    _import_tensorboardx()  # imported here: only the writing process needs it
    from tensorboardX import SummaryWriter

    return SummaryWriter(layout.run_path(workdir, layout.TENSORBOARD), filename_suffix=_event_file_suffix(), **kwargs)


class ScalarEvents:
    """TensorBoard scalars written to a new event file of `<workdir>/tensorboard`, in the calling thread.

    tensorboardX's SummaryWriter writes from a thread of its own: on a full disk that thread would print a
    traceback and stop, and the run would then block on the writer's full queue. Events logged before
    `purge_step` by an earlier attempt are dropped by TensorBoard (a SessionLog.START at that step, as
    SummaryWriter's `purge_step` writes).
    """

    def __init__(self, workdir: str, purge_step: int) -> None:
        _import_tensorboardx()
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self.directory = layout.run_path(workdir, layout.TENSORBOARD)
        make_dirs(self.directory)
        self._events = EventsWriter(os.path.join(self.directory, "events"), _event_file_suffix())
        now = time.time()
        self._events.write_event(Event(wall_time=now, step=purge_step, file_version="brain.Event:2"))
        self._events.write_event(Event(wall_time=now, step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def add(self, values: Mapping[str, float], step: int) -> None:
        """Write one scalar per {tag: value} at `step`, then flush them to the file."""
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        with self._naming_failures():
            for tag, value in values.items():
                self._events.write_event(Event(wall_time=time.time(), step=step, summary=scalar(tag, value)))
            self._events.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        with self._naming_failures():
            self._events.close()

    @contextlib.contextmanager
    def _naming_failures(self) -> Iterator[None]:
        """An OSError of a write names the events' folder (a failed write() names no file)."""
        try:
            yield
        except OSError as error:
            if error.errno is None or error.filename:
                raise
            raise OSError(error.errno, error.strerror, self.directory) from error


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
        values = {key: float(value) for key, value in timing.items()}
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


def read_records(path: str) -> list[dict[str, Any]]:
    """The records of `path`, one JSON object with a "step" per line.

    A last line without its newline that starts like a record was cut short by a crash mid-write: it is
    skipped (a resume writes it again). Any other line that is no record means the file was damaged or
    edited: CheckpointError names the line and the repair.
    """
    lines = read_bytes(path).split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        if last and not line:
            break
        try:
            record = json.loads(line.decode("utf-8"))
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("no integer step")
        except ValueError as error:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
            if last and _cut_short(line):
                break
            raise CheckpointError(
                f"{path} is damaged: line {number} is not a JSON record ({_why(error, line)}); delete that line and "
                "any damaged ones after it, or restore the file, then run the same command again"
            ) from None
        records.append(record)
    return records


def _cut_short(line: bytes) -> bool:
    """Whether `line` may be the start of a record (json.dumps writes ASCII, and every record starts the same)."""
    start = b'{"step": '
    return line.isascii() and (line.startswith(start) or start.startswith(line))


def _why(error: ValueError, line: bytes) -> str:
    if isinstance(error, UnicodeDecodeError):
        return f"byte 0x{line[error.start]:02x} at column {error.start + 1} is not UTF-8 text"
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} at column {error.colno}"
    return str(error)


def check_logs(workdir: str) -> None:
    """Raise CheckpointError when metrics.jsonl or timing.jsonl of `workdir` is damaged (see read_records)."""
    for name in (layout.METRICS, layout.TIMING):
        path = layout.run_path(workdir, name)
        if is_file(path):
            read_records(path)


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """All records of `<workdir>/metrics.jsonl`, in order."""
    return read_records(layout.run_path(workdir, layout.METRICS))
