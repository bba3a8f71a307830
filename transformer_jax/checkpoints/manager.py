"""Orbax checkpoints of a run: train state, data-iterator position and run metadata, saved together.

Orbax writes each step into a temporary directory and renames it only once complete, so a crash
mid-save never produces a "latest" that cannot be restored. The last `keep` steps are kept, plus
the best one by a dev metric when one is given.

A save holds training up only for as long as it takes to start copying the state to host memory. In a
one-process run everything else (the finiteness check and the checksums, computed on the host copy; Orbax's
writes, its rename of the finished directory and the removal of old steps) runs in a thread of its own,
one save at a time; a save waits for the one before it. A run of several processes keeps Orbax's call on
the training thread (Orbax synchronises the processes there with device collectives, which a second thread
would interleave with the step's) and Orbax writes the files in the background.

Every save records per-array checksums, which every restore verifies; reading checkpoints back (also while a run
is writing them) is `CheckpointReader`'s (restoring.py), which `Checkpointer` extends.

A save the storage refuses (a full disk, a quota, a read-only file system) is one StorageError naming
the step, the newest complete checkpoint (which stays: Orbax removes old steps only after a new one is
complete) and how to go on; the tracebacks that Orbax's background threads would log about it are left
out. The failed save's temporary directory is never taken for a checkpoint, and the next writer's start
removes it (Orbax's cleanup of unfinished saves; threads of Orbax may write to it until then).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp

from transformer_jax.base.files import DirectoryWatch, absolute, storage_errno, storage_error, storage_remedy
from transformer_jax.checkpoints.integrity import (
    checksum_meta,
    host_checksums,
    host_is_finite,
    silence_abandoned_io,
    state_checksums,
    tree_is_finite,
)
from transformer_jax.checkpoints.restoring import CheckpointReader, VanishedSteps
from transformer_jax.errors import StorageError

_policies = ocp.checkpoint_managers.preservation_policy


def best_metric_for(bleu_every: int) -> tuple[str, str]:
    """The dev metric that ranks checkpoints: BLEU when it is computed during training, else loss."""
    return ("dev_bleu", "max") if bleu_every else ("dev_loss", "min")


def host_copy(state: Any) -> Any:
    """A copy of `state` in host memory, started and not waited for: each array is copied to its devices'
    pinned host memory (a device memory copy where a device has none), so the caller may donate `state` to its
    next step at once; reading the copy waits for the transfer. One call for all the arrays (per array, the
    Python of a transfer would cost a large state's 700 arrays a tenth of a second)."""
    leaves, tree = jax.tree.flatten(state)
    arrays = [index for index, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    if not arrays:
        return state

    def host(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
        kinds = {memory.kind for memory in next(iter(sharding.device_set)).addressable_memories()}
        return sharding.with_memory_kind("pinned_host") if "pinned_host" in kinds else sharding

    targets: dict[jax.sharding.Sharding, jax.sharding.Sharding] = {}  # a few shardings among hundreds of arrays
    for index in arrays:
        if leaves[index].sharding not in targets:
            targets[leaves[index].sharding] = host(leaves[index].sharding)
    shardings = [targets[leaves[index].sharding] for index in arrays]
    copies = jax.device_put([leaves[i] for i in arrays], shardings, may_alias=False)
    for index, copied in zip(arrays, copies):
        leaves[index] = copied
    return jax.tree.unflatten(tree, leaves)


def _await_startup_cleanup(manager: ocp.CheckpointManager) -> None:
    """Wait for the clean-up of unfinished saves that Orbax's CheckpointManager starts when it is made.

    Orbax (0.12) exposes no public wait for it (neither wait_until_finished() nor close() joins it); where a
    later Orbax drops the private method, its own next save() still waits for the clean-up.
    """
    wait = getattr(manager, "_maybe_await_cleanup_tmp_directory", None)
    if wait is not None:
        wait()


class Checkpointer(CheckpointReader):
    """Saves and restores {state, data, meta} under `<directory>/<step>/` with an Orbax manager (restoring: see
    `CheckpointReader`).

    `best_metric` (e.g. "dev_bleu", higher is better, or "dev_loss", lower is better) marks which
    value passed to `save(metrics=...)` ranks checkpoints for `best_step()`.
    """

    def __init__(
        self,
        directory: str,
        keep: int = 5,
        best_metric: str | None = None,
        best_mode: str = "max",
        asynchronous: bool = True,
        read_only: bool = False,
    ) -> None:
        self.directory = absolute(directory)
        self.read_only = read_only
        # One process: saves are written by a thread of ours, Orbax called synchronously in it (see the docstring).
        self.in_background = asynchronous and not read_only and jax.process_count() == 1
        orbax_async = asynchronous and not self.in_background
        self.best_metric, self.best_mode = best_metric, best_mode
        policies: list[Any] = [_policies.LatestN(keep)]
        if best_metric:
            sign = 1.0 if best_mode == "max" else -1.0
            policies.append(
                _policies.BestN(
                    get_metric_fn=lambda metrics: sign * metrics[best_metric],
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
        if read_only:
            # What Orbax's read_only=True amounts to, set one by one (read_only itself warns twice on every
            # reader): nothing is created, unfinished saves are left to the writer (which may be mid-save),
            # and nothing is saved or deleted (save() refuses; deleting happens only in a save).
            options = ocp.CheckpointManagerOptions(save_interval_steps=0, create=False, cleanup_tmp_directories=False,
                                                   enable_async_checkpointing=orbax_async)
        else:
            options = ocp.CheckpointManagerOptions(
                preservation_policy=_policies.AnyPreservationPolicy(policies),
                enable_async_checkpointing=orbax_async,
                cleanup_tmp_directories=True,  # what a crash or a full disk left mid-save
            )
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "data": ocp.JsonCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        self._vanished: VanishedSteps | None = None
        if read_only:  # a writer of the same run may rotate steps away while this reads: its logs about them go
            self._vanished = VanishedSteps(self.directory)
            logging.getLogger("absl").addFilter(self._vanished)  # the logger Orbax logs to
        try:  # Orbax lists the steps as it starts (and on every reload): see `_listed`
            self.manager = self._listed(lambda: ocp.CheckpointManager(self.directory, options=options,
                                                                      item_handlers=handlers))
        except BaseException:
            logging.getLogger("absl").removeFilter(self._vanished)
            raise
        # Orbax removes what an interrupted save left in a background thread that only its next save() waits
        # for: a process that ends before saving (a signal while compiling, eval.py) must not leave that
        # thread to meet the interpreter's shutdown ("cannot schedule new futures after shutdown").
        _await_startup_cleanup(self.manager)
        self._faults: _StorageFaults | None = None
        if not read_only:  # made by the manager: watched from now on
            self._faults = _StorageFaults(DirectoryWatch(self.directory))
            logging.getLogger("absl").addFilter(self._faults)  # the logger Orbax logs to
        self.pending: int | None = None  # the step of the save started last, until it is waited for
        self.failed = False  # whether the storage refused a save (raised once, as StorageError)
        self._writer: threading.Thread | None = None  # the thread writing the pending save (in_background)
        self._written: BaseException | None = None  # what the writer raised, raised again by `wait`
        self._manager_lock = threading.Lock()  # the writer's Orbax calls against `steps`'s

    def save(
        self,
        step: int,
        state: Any,
        data_state: dict[str, Any],
        meta: dict[str, Any],
        metrics: dict[str, float] | None = None,
    ) -> bool:
        """Start saving `state` at `step` (asynchronously); refuse non-finite parameters.

        Parameters that hold NaN or Inf are not saved: an error line says so, and False is returned where that is
        known at once (several processes; one process checks in the writer, after this returns True). Raises
        StorageError when the storage refuses this save or the one before it (which is waited for first).
        """
        if self.read_only:
            raise RuntimeError(f"{self.directory} was opened read-only: it takes no checkpoints")
        if self.in_background:
            self.wait()
            copied = host_copy(state)  # the one thing the training thread waits for: the copy's start
            self.pending = step
            records = copy.deepcopy((data_state, meta, metrics))  # the caller's to change once this returns
            self._writer = threading.Thread(target=self._write_in_background, name=f"checkpoint-{step}",
                                            args=(step, copied, *records))
            self._writer.start()
            return True
        if not bool(jax.device_get(tree_is_finite(state.params))):
            _not_finite(step)
            return False
        self.wait()
        self.pending = step
        try:
            self._write(step, state, data_state, {**meta, **checksum_meta(state_checksums(state))}, metrics)
        except Exception as error:
            raise self._save_failed(error) from None
        return True

    def _write_in_background(self, step: int, state: Any, data_state: dict[str, Any], meta: dict[str, Any],
                             metrics: dict[str, float] | None) -> None:
        """The writer thread of a one-process save: checks and checksums on the host copy, then Orbax's writes."""
        try:
            if not host_is_finite(state.params):
                _not_finite(step)
                return
            self._write(step, state, data_state, {**meta, **checksum_meta(host_checksums(state))}, metrics)
        except BaseException as error:  # noqa: BLE001 - raised again on the training thread by `wait`
            self._written = error

    def _write(self, step: int, state: Any, data_state: dict[str, Any], meta: dict[str, Any],
               metrics: dict[str, float] | None) -> None:
        """Orbax's save of `step`: the state, the data position and `meta` with the step and its metrics."""
        meta = {**meta, "step": step, "metrics": metrics or {}}
        ranked = metrics if metrics and self.best_metric in metrics else None
        with self._manager_lock:
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=ocp.args.JsonSave(data_state),
                    meta=ocp.args.JsonSave(meta),
                ),
                metrics=ranked,
                force=True,
            )

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk; StorageError when the storage refused one."""
        if self._writer is not None:
            self._writer.join()
            self._writer, error, self._written = None, self._written, None
            if isinstance(error, Exception):
                raise self._save_failed(error) from None
            if error is not None:
                raise error
        try:
            self.manager.wait_until_finished()
        except Exception as error:
            raise self._save_failed(error) from None
        self.pending = None

    def resume_advice(self, remedy: str = "free space") -> str:
        """What a failed run keeps and how to go on: "checkpoint step 6 is kept; <remedy> and run the same command
        again: it resumes from step 6" (pending saves are not waited for)."""
        kept = self.latest_step()
        if kept is None:
            return f"no checkpoint was written yet; {remedy} and run the same command again: it starts from step 0"
        return f"checkpoint step {kept} is kept; {remedy} and run the same command again: it resumes from step {kept}"

    def _save_failed(self, error: Exception) -> Exception:
        """What to raise for a save that failed with `error`: a StorageError when the storage refused it, else
        `error` itself (a bug, which keeps its traceback)."""
        step, self.pending = self.pending, None
        silence_abandoned_io()  # the failed save's other writes are abandoned in flight
        if storage_errno(error) is None:
            return error
        self.failed = True
        return storage_error(error, f"writing checkpoint step {step} to {self.directory}",
                             self.resume_advice(storage_remedy(error)))

    def close(self) -> None:
        """Finish pending saves and release the manager.

        Raises StorageError, as `wait`, when the storage refused a save, unless one was raised already.
        """
        already = self.failed
        try:
            try:
                self.wait()
            finally:
                self.manager.close()  # Orbax may raise a failed save (again) here
        except Exception as error:
            if not already:
                raise (error if isinstance(error, StorageError) else self._save_failed(error)) from None
        finally:
            if self._faults is not None:
                logging.getLogger("absl").removeFilter(self._faults)
                self._faults.watch.close()
            if self._vanished is not None:
                logging.getLogger("absl").removeFilter(self._vanished)


def _not_finite(step: int) -> None:
    logging.error("parameters at step %d are not finite: checkpoint not written", step)


class _StorageFaults(logging.Filter):
    """Keeps what Orbax's threads log about a failed save to one line at most: the caller gets that failure
    from `Checkpointer.wait`/`save`/`close`, the same exception with its traceback.

    One failed save logs its traceback from every thread that waited on it (five or more). Those of a
    save the storage refused, or whose directory vanished (`watch`), are dropped: the caller gives the
    one line. Of any other failure only the line that names it stays.
    """

    def __init__(self, watch: DirectoryWatch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        error = record.exc_info[1] if record.exc_info else None
        if storage_errno(error) is not None or storage_errno(Exception(record.getMessage())) is not None:
            return False
        if error is not None:
            if self.watch.vanished():
                return False
            record.exc_info, record.exc_text = None, None
        return True
