"""Orbax checkpoints of a run: train state, data-iterator position and run metadata, saved together.

Orbax writes each step into a temporary directory and renames it only once complete, so a crash
mid-save never produces a "latest" that cannot be restored. The last `keep` steps are kept, plus
the best one by a dev metric when one is given.

A complete directory can still be damaged later: every save records per-array checksums, every
restore verifies them, and `restore_latest` falls back past damaged checkpoints, setting them aside
(see `checkpoint_integrity`).
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import orbax.checkpoint as ocp

from transformer_jax.base.files import absolute
from transformer_jax.checkpoints.integrity import (
    check_shapes,
    checkpoint_label,
    newest_intact,
    reading,
    set_aside,
    state_checksums,
    tree_is_finite,
    unbox_saved,
    verify_checksums,
)

_policies = ocp.checkpoint_managers.preservation_policy


def best_metric_for(bleu_every: int) -> tuple[str, str]:
    """The dev metric that ranks checkpoints: BLEU when it is computed during training, else loss."""
    return ("dev_bleu", "max") if bleu_every else ("dev_loss", "min")


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
        self.directory = absolute(directory)
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
        with reading(self._where(step)):
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
        with reading(self._where(step)):
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

        Newer checkpoints that cannot be read back are reported (one warning line each), and the writer
        moves them aside to `<directory>.corrupt/` (kept for inspection, and out of the way of the steps
        saved again).
        When none can be restored, nothing is moved and CheckpointError says so.
        """
        found = newest_intact(self.directory, reversed(self.steps()), lambda step: self.restore(step, abstract_state))
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

        Raises CorruptCheckpointError (naming the step and how to choose another) when it cannot be read.
        """
        with reading(self._where(step), "; choose another with --checkpoint=STEP"):
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
            verify_checksums(params, restored["meta"].get("checksums", {}), self._where(step), prefix="params/")
        return params

    def _where(self, step: int) -> str:
        return checkpoint_label(self.directory, step)

    def _check_shapes(self, step: int, abstract_state: Any) -> None:
        saved = self.manager.item_metadata(step)["state"]
        check_shapes(getattr(saved, "tree", saved), abstract_state, self._where(step))

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()
