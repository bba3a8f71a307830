"""Orbax checkpoints of a run: train state, data-iterator position and run metadata, saved together.

Orbax writes each step into a temporary directory and renames it only once complete, so a crash
mid-save never produces a "latest" that cannot be restored. The last `keep` steps are kept, plus
the best one by a dev metric when one is given.

A complete directory can still be damaged later (a truncated copy, a bad disk). Every checkpoint
carries a checksum of each array of the state, verified on restore; `restore_latest` reports a
checkpoint that cannot be read or does not match, moves it aside (never deletes it) and falls
back to the previous one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from transformer_jax.errors import (
    CheckpointError,
    CorruptCheckpointError,
    ShapeMismatchError,
)

_policies = ocp.checkpoint_managers.preservation_policy





def _leaves_by_path(tree: Any) -> dict[str, Any]:
    """{'params/encoder/...': leaf} for every array-like leaf (logical-axis boxes removed)."""
    leaves = jax.tree_util.tree_leaves_with_path(
        _unbox_saved(nn.meta.unbox(tree)), is_leaf=lambda x: hasattr(x, "shape")
    )
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


@jax.jit
def _checksums(leaves: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Per array: the sum of its element bit patterns weighted by position, modulo 2^32.

    Integer sums are exact and order-free, so the value does not depend on the sharding or on how
    many processes compute it; a flipped bit, a zeroed block or two swapped values change it.
    """
    def checksum(x: jax.Array) -> jax.Array:
        x = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
        position, stride = jnp.zeros(x.shape, jnp.uint32), 1
        for axis in reversed(range(x.ndim)):  # the flat index, without reshaping a sharded array
            position = position + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride)
            stride *= x.shape[axis]
        return jnp.sum(bits * (position * jnp.uint32(2654435761) + jnp.uint32(1)), dtype=jnp.uint32)

    return {key: checksum(leaf) for key, leaf in leaves.items()}


def state_checksums(state: Any, prefix: str = "") -> dict[str, int]:
    """{path: checksum} of every array of `state` (keys start with `prefix`)."""
    sums = jax.device_get(_checksums(_leaves_by_path(state)))
    return {prefix + key: int(value) for key, value in sums.items()}


def verify_checksums(restored: Any, saved: dict[str, int], where: str, prefix: str = "") -> None:
    """Raise CorruptCheckpointError naming the first array whose checksum differs from the saved one."""
    for key, value in state_checksums(restored, prefix).items():
        if key in saved and saved[key] != value:
            raise CorruptCheckpointError(f"{where}: array {key} does not match its checksum")


@jax.jit
def tree_is_finite(tree: Any) -> jax.Array:
    """True when every element of every leaf is finite."""
    leaves = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves))


def best_metric_for(bleu_every: int) -> tuple[str, str]:
    """The dev metric that ranks checkpoints: BLEU when it is computed during training, else loss."""
    return ("dev_bleu", "max") if bleu_every else ("dev_loss", "min")


def _unbox_saved(tree: Any) -> Any:
    """Saved logical-axis boxes come back as {"value": array}; return the arrays themselves."""
    if isinstance(tree, dict):
        if set(tree) == {"value"}:
            return tree["value"]
        return {key: _unbox_saved(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_unbox_saved(value) for value in tree)
    return tree


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
    """{'params/encoder/layer_0/...': shape} for every array-like leaf (logical-axis boxes removed)."""
    return {key: tuple(leaf.shape) for key, leaf in _leaves_by_path(tree).items()}


def check_shapes(saved: Any, expected: Any, what: str) -> None:
    """Raise ShapeMismatchError naming the first leaf whose saved shape differs from the expected one."""
    saved_shapes = _shapes_by_path(saved)
    for key, shape in _shapes_by_path(expected).items():
        if saved_shapes.get(key) != shape:
            raise ShapeMismatchError(
                f"{what} does not match the config: {key} is {saved_shapes.get(key, 'missing')} on disk "
                f"but {shape} in the model; use the config the run was started with, or a new workdir"
            )


def _all_processes_agree(ok: bool) -> bool:
    """True when `ok` holds on every process (one process alone: `ok` itself)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


class Checkpointer:
    """Saves and restores {state, data, meta} under `<directory>/<step>/` with an Orbax manager.

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
        self.directory = os.path.abspath(directory)
        self.read_only = read_only
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
        options = ocp.CheckpointManagerOptions(
            preservation_policy=_policies.AnyPreservationPolicy(policies),
            enable_async_checkpointing=asynchronous,
            # Only the writer may remove unfinished saves: a reader (eval.py during training) must not.
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
            create=not read_only,
        )
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "data": ocp.JsonCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def save(
        self,
        step: int,
        state: Any,
        data_state: dict[str, Any],
        meta: dict[str, Any],
        metrics: dict[str, float] | None = None,
    ) -> bool:
        """Start saving `state` at `step` (asynchronously); refuse non-finite parameters.

        Returns False (and saves nothing) when the parameters hold NaN or Inf.
        """
        if not bool(jax.device_get(tree_is_finite(state.params))):
            return False
        ranked = metrics if metrics and self.best_metric in metrics else None
        meta = {**meta, "step": step, "metrics": metrics or {}, "checksums": state_checksums(state)}
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
        return True

    def steps(self) -> list[int]:
        """Complete checkpoints on disk, oldest first."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def meta(self, step: int) -> dict[str, Any]:
        """The run metadata saved with `step` (config, metrics, ...)."""
        with self._reading(step):
            return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def best_step(self) -> int | None:
        """The kept step with the best `best_metric`, or None when none was ranked."""
        ranked = []
        for step in self.steps():
            value = self.meta(step).get("metrics", {}).get(self.best_metric)
            if value is not None:
                ranked.append((value if self.best_mode == "max" else -value, step))
        return max(ranked)[1] if ranked else None

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(state, data_state, meta) of `step`, placed as `abstract_state`'s shardings say.

        Raises ShapeMismatchError when the saved shapes differ from `abstract_state`'s, and
        CorruptCheckpointError when the directory cannot be read back intact.
        """
        with self._reading(step):
            self._check_shapes(step, abstract_state)
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=ocp.args.JsonRestore(),
                    meta=ocp.args.JsonRestore(),
                ),
            )
            verify_checksums(restored["state"], restored["meta"].get("checksums", {}), self._where(step))
        return restored["state"], restored["data"], restored["meta"]

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any], dict[str, Any]] | None:
        """(step, state, data_state, meta) of the newest checkpoint that restores intact; None if there is none.

        Newer checkpoints that cannot be read back are reported, and the writer moves them aside to
        `<directory>.corrupt/` (kept for inspection, and out of the way of the steps saved again).
        When none can be restored, nothing is moved and CheckpointError says so.
        """
        unreadable: list[tuple[int, CheckpointError]] = []
        for step in reversed(self.steps()):
            error = None
            try:
                state, data_state, meta = self.restore(step, abstract_state)
            except CorruptCheckpointError as caught:
                error = caught
            if not _all_processes_agree(error is None):
                error = error or CorruptCheckpointError(f"{self._where(step)} cannot be read by another process")
                logging.warning("%s; trying the previous checkpoint", error)
                unreadable.append((step, error))
                continue
            self._set_aside([bad for bad, _ in unreadable])
            return step, state, data_state, meta
        if unreadable:
            raise CheckpointError(
                f"no checkpoint in {self.directory} can be restored (newest: {unreadable[0][1]}); move the "
                "damaged ones away to start over, or use a new workdir"
            )
        return None

    def restore_params(self, step: int) -> Any:
        """The parameters of `step` as plain arrays on one local device, whatever mesh saved them.

        Raises CorruptCheckpointError (naming the step and how to choose another) when it cannot be read.
        """
        with self._reading(step, "; choose another with --checkpoint=STEP"):
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
            params = _unbox_saved(restored["state"]["params"])
            verify_checksums(params, restored["meta"].get("checksums", {}), self._where(step), prefix="params/")
        return params

    def _where(self, step: int) -> str:
        return f"checkpoint {self.directory}/{step}"

    @contextlib.contextmanager
    def _reading(self, step: int, advice: str = "") -> Iterator[None]:
        """Report any failure to read `step` back (other than a config mismatch) as CorruptCheckpointError."""
        try:
            yield
        except CorruptCheckpointError as error:
            raise CorruptCheckpointError(f"{error}{advice}") from None
        except ShapeMismatchError:
            raise
        except Exception as error:  # noqa: BLE001 - truncated files, bad JSON, ... all mean "unreadable"
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
            detail = detail.split(" See full TensorStore details")[0][:200]
            raise CorruptCheckpointError(f"{self._where(step)} cannot be read ({detail}){advice}") from None

    def _set_aside(self, steps: list[int]) -> None:
        """Move unreadable step directories to `<directory>.corrupt/` (process 0 of a writer only)."""
        if not steps or self.read_only:
            return
        if jax.process_index() == 0:
            for step in steps:
                destination = os.path.join(f"{self.directory}.corrupt", str(step))
                suffix = 0
                while os.path.exists(destination):
                    suffix += 1
                    destination = os.path.join(f"{self.directory}.corrupt", f"{step}.{suffix}")
                os.makedirs(os.path.dirname(destination), exist_ok=True)
                shutil.move(os.path.join(self.directory, str(step)), destination)
                logging.warning("moved the unreadable checkpoint %s/%d to %s (inspect or delete it)",
                                self.directory, step, destination)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("unreadable checkpoints set aside")
        self.manager.reload()

    def _check_shapes(self, step: int, abstract_state: Any) -> None:
        saved = self.manager.item_metadata(step)["state"]
        check_shapes(getattr(saved, "tree", saved), abstract_state, f"checkpoint {self.directory}/{step}")

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()
