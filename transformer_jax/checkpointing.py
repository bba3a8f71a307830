"""Orbax checkpoints of a run: train state, data-iterator position and run metadata, saved together.

Orbax writes each step into a temporary directory and renames it only once complete, so a crash
mid-save never produces a "latest" that cannot be restored. The last `keep` steps are kept, plus
the best one by a dev metric when one is given.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

_policies = ocp.checkpoint_managers.preservation_policy


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used as asked; the message names it and the fix."""


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
    leaves = jax.tree_util.tree_leaves_with_path(
        _unbox_saved(nn.meta.unbox(tree)), is_leaf=lambda x: hasattr(x, "shape")
    )
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape) for path, leaf in leaves}


def check_shapes(saved: Any, expected: Any, what: str) -> None:
    """Raise CheckpointError naming the first leaf whose saved shape differs from the expected one."""
    saved_shapes = _shapes_by_path(saved)
    for key, shape in _shapes_by_path(expected).items():
        if saved_shapes.get(key) != shape:
            raise CheckpointError(
                f"{what} does not match the config: {key} is {saved_shapes.get(key, 'missing')} on disk "
                f"but {shape} in the model; use the config the run was started with, or a new workdir"
            )


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
        if not bool(tree_is_finite(state.params)):
            return False
        ranked = metrics if metrics and self.best_metric in metrics else None
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(data_state),
                meta=ocp.args.JsonSave({**meta, "step": step, "metrics": metrics or {}}),
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

        Raises CheckpointError when the saved shapes differ from `abstract_state`'s.
        """
        self._check_shapes(step, abstract_state)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=ocp.args.JsonRestore(),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], restored["data"], restored["meta"]

    def restore_params(self, step: int) -> Any:
        """The parameters of `step` as plain arrays on one local device, whatever mesh saved them."""
        saved = self.manager.item_metadata(step)["state"]
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
            getattr(saved, "tree", saved),
            is_leaf=lambda x: hasattr(x, "shape"),
        )
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        )
        return _unbox_saved(restored["state"]["params"])

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
