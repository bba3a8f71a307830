"""A run's JSON-lines logs read back (`metrics.jsonl`, `timing.jsonl`): one record per line, a line cut short
by a crash skipped, a damaged one named with its repair.

Read by the training loop (at a resume, before it appends), the plots and the commands saying what a stopped
run kept; written by run/metrics_log.py.
"""

from __future__ import annotations

import json
from typing import Any

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import is_file, read_bytes
from transformer_jax.errors import CheckpointError


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
