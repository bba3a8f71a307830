"""Reading a run's checkpoints back: the steps listed, their metadata, the best one, a state or its parameters.

`CheckpointReader` is the read side of `Checkpointer` (manager.py), which adds saving to it. A complete checkpoint
directory can still be damaged later: every save records per-array checksums, every restore verifies them, and
`restore_latest` falls back past damaged checkpoints, setting them aside (see `checkpoint_integrity`).

A reader (eval.py, a `Translator`) may open a run whose training is still writing it: a step the writer rotates
away while the reader lists the steps is no step (the listing is taken again), one rotated away while it is read
is one CorruptCheckpointError saying so (`restore_params`), and what Orbax logs about such a step is left out
(`VanishedSteps`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any, Callable, TypeVar

import jax
import orbax.checkpoint as ocp

from transformer_jax.base.files import exists, is_dir, list_names
from transformer_jax.checkpoints.integrity import (
    check_record,
    check_shapes,
    checkpoint_label,
    newest_intact,
    reading,
    set_aside,
    unbox_saved,
    verify_checksums,
)
from transformer_jax.errors import CheckpointError, CorruptCheckpointError

# How often the steps are listed again when a step vanished while Orbax listed them (a writer rotating them away
# removes one a save; more in a row means the directory is being removed, which the last try reports).
_LISTING_TRIES = 5
# How long a reader whose step lacks a file waits for the step to vanish before calling it damaged: a writer removes a
# rotated step's files one by one, then its directory (milliseconds locally, longer on an object store).
_REMOVAL_GRACE_S = 2.0
_Listed = TypeVar("_Listed")

# What a caller checks a checkpoint's records with: (data_state, meta) -> what is wrong with them, or None.
RecordCheck = Callable[[dict[str, Any], dict[str, Any]], "str | None"]


class CheckpointReader:
    """Reads the checkpoints `<directory>/<step>/` ({state, data, meta}) of an Orbax manager.

    Made by `Checkpointer`, which sets what this reads: the directory, the Orbax manager, whether it was opened
    read-only, the metric that ranks checkpoints and the lock that keeps listing apart from a save in progress.
    """

    directory: str
    manager: ocp.CheckpointManager
    read_only: bool
    best_metric: str | None
    best_mode: str
    _manager_lock: threading.Lock

    def steps(self) -> list[int]:
        """Complete checkpoints on disk, oldest first; a file named as a step (a bad copy, a hand-made mistake)
        counts as one, which cannot be read back (Orbax lists only directories, and would save over it)."""
        with self._manager_lock:  # not while the writer is in Orbax's save
            saved = self._listed(self._reloaded_steps)
        return sorted(set(saved) | set(self._files_named_as_steps()))

    def _reloaded_steps(self) -> list[int]:
        self.manager.reload()
        return list(self.manager.all_steps())

    def _listed(self, listing: Callable[[], _Listed]) -> _Listed:
        """`listing()` (an Orbax call that lists the steps), taken again when a step vanished while it ran.

        Orbax lists the step directories, then reads each one's metadata and times: a step the run writing this
        directory removes in between (training.keep_checkpoints) is a FileNotFoundError naming it. It is no
        step any more, and the next listing leaves it out. CheckpointError when steps keep vanishing.
        """
        for _ in range(_LISTING_TRIES):
            try:
                return listing()
            except FileNotFoundError as error:
                vanished = error.filename
        raise CheckpointError(f"the checkpoints in {self.directory} kept vanishing while they were listed ({vanished} "
                              "last); if a training run writes there, run the same command again, else check what "
                              "removes them")

    def _files_named_as_steps(self) -> list[int]:
        if not is_dir(self.directory):
            return []
        return [int(name) for name in list_names(self.directory)
                if name.isdigit() and not is_dir(os.path.join(self.directory, name))]

    def _check_is_directory(self, step: int) -> None:
        if step in self._files_named_as_steps():
            raise CorruptCheckpointError(f"{self._where(step)} is a file, not a checkpoint directory")

    def latest_step(self) -> int | None:
        """The newest complete checkpoint, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def meta(self, step: int) -> dict[str, Any]:
        """The run metadata saved with `step` (config, metrics, ...)."""
        with reading(self._where(step)):
            self._check_is_directory(step)
            return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def best_step(self) -> int | None:
        """The kept step with the best `best_metric`, or None when none was ranked."""
        ranked = []
        for step in self.steps():
            try:
                meta = self.meta(step)
            except CorruptCheckpointError:
                if self.read_only and step not in self.steps():
                    continue  # rotated away by the run writing it since it was listed: no longer a candidate
                raise
            value = meta.get("metrics", {}).get(self.best_metric)
            if value is not None:
                ranked.append((value if self.best_mode == "max" else -value, step))
        return max(ranked)[1] if ranked else None

    def restore(self, step: int, abstract_state: Any,
                check_records: RecordCheck | None = None) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(state, data_state, meta) of `step`, placed as `abstract_state`'s shardings say.

        Raises ShapeMismatchError when the saved shapes differ from `abstract_state`'s, and
        CorruptCheckpointError when the directory cannot be read back intact: an array that fails its
        checksum, or a data or meta record that is not a JSON object or that `check_records(data_state,
        meta)` finds malformed (it returns what is wrong, or None).
        """
        with reading(self._where(step)):
            self._check_is_directory(step)
            self._check_shapes(step, abstract_state)
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=ocp.args.JsonRestore(),
                    meta=ocp.args.JsonRestore(),
                ),
            )
            check_record(restored["meta"], "meta", self._where(step))
            check_record(restored["data"], "data", self._where(step))
            verify_checksums(restored["state"], restored["meta"], self._where(step))
            problem = check_records(restored["data"], restored["meta"]) if check_records else None
            if problem:
                raise CorruptCheckpointError(f"{self._where(step)} is damaged: {problem}")
        return restored["state"], restored["data"], restored["meta"]

    def restore_latest(self, abstract_state: Any, check_records: RecordCheck | None = None
                       ) -> tuple[int, Any, dict[str, Any], dict[str, Any]] | None:
        """(step, state, data_state, meta) of the newest checkpoint that restores intact (see `restore` for
        `check_records`); None if there is none.

        Newer checkpoints that cannot be read back are reported (one warning line each), and the writer
        moves them aside to `<directory>.corrupt/` (kept for inspection, and out of the way of the steps
        saved again).
        When none can be restored, nothing is moved and CheckpointError says so.
        """
        found = newest_intact(self.directory, reversed(self.steps()), lambda step: self.restore(step, abstract_state, check_records))
        if found is None:
            return None
        step, (state, data_state, meta), unreadable = found
        moved = {}
        if unreadable and not self.read_only:  # only a writer moves files; a reader (eval.py) leaves them
            moved = set_aside(self.directory, [bad for bad, _ in unreadable])
            self.manager.reload()
        for bad, error in unreadable:  # one line each: what is wrong, where it went, what is used instead
            aside = f"; moved to {moved[bad]} (inspect or delete it)" if bad in moved else ""
            logging.warning("%s%s; resuming from step %d", error, aside, step)
        return step, state, data_state, meta

    def restore_params(self, step: int) -> Any:
        """The parameters of `step` as plain arrays on one local device, whatever mesh saved them.

        Raises CorruptCheckpointError (naming the step and how to choose another) when it cannot be read; when the
        step is gone once the read failed, that it was rotated away by the run writing it (training.keep_checkpoints).
        """
        try:
            return self._restore_params(step)
        except CorruptCheckpointError as error:
            if not self.read_only or not self._rotated_away(step, error):
                raise
            raise CorruptCheckpointError(
                f"{self._where(step)} was removed while it was read: the training run writing {self.directory} keeps "
                "only its newest checkpoints (training.keep_checkpoints) and rotated it away; run the same command "
                "again for the newest, or choose a step it keeps with --checkpoint=STEP") from None

    def _rotated_away(self, step: int, error: CorruptCheckpointError) -> bool:
        """Whether `step`, whose read failed with `error`, was removed by the run writing this directory: it is gone
        from the steps, at once, or within _REMOVAL_GRACE_S when a file of it was missing (a removal under way: the
        writer deletes a step's files before its directory). A step that stays is damaged."""
        missing = re.search(r"not[ _]found|no such file|does not exist", str(error), re.IGNORECASE) is not None
        deadline = time.monotonic() + (_REMOVAL_GRACE_S if missing else 0.0)
        while step in self.steps():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def _restore_params(self, step: int) -> Any:
        with reading(self._where(step), "; choose another with --checkpoint=STEP"):
            self._check_is_directory(step)
            saved = self.manager.item_metadata(step)["state"]
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            target = jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
                getattr(saved, "tree", saved),
                is_leaf=lambda x: hasattr(x, "shape"),
            )
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
            )
            params = unbox_saved(restored["state"]["params"])
            verify_checksums(params, restored["meta"], self._where(step), prefix="params/")
        return params

    def _where(self, step: int) -> str:
        return checkpoint_label(self.directory, step)

    def _check_shapes(self, step: int, abstract_state: Any) -> None:
        saved = self.manager.item_metadata(step)["state"]
        check_shapes(getattr(saved, "tree", saved), abstract_state, self._where(step))


class VanishedSteps(logging.Filter):
    """Drops what Orbax logs about a file or step of `directory` that is gone (e.g. "Metadata file does not exist:
    <directory>/6/_CHECKPOINT_METADATA" when the run writing it was removing step 6 as a reader listed it): the
    reader lists the steps again (`CheckpointReader._listed`) or says in one line that its step went."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self._step_path = re.compile(re.escape(directory.rstrip("/")) + r"/\d+(?:/[^\s'\"]*)?")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        named = self._step_path.search(record.getMessage())
        return named is None or exists(named.group(0))
