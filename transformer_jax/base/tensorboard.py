"""TensorBoard event files under a run's `tensorboard/` folder: the training scalars (`ScalarEvents`, written in
the calling thread) and a writer for figures (`tensorboard_writer`), each with an event file of its own.

tensorboardX is imported only when a file is written, and without PyTorch (`_import_tensorboardx`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from typing import Any, Iterator, Mapping

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import make_dirs


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
