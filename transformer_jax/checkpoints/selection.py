"""Choosing a reopened run's checkpoints (latest, best, a step, the average of the last N), their parameters
checked against the run's config, and averaged parameters written."""

from __future__ import annotations

import contextlib
import glob
import logging
import numbers
import os
import re
import shutil
from typing import Any, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from transformer_jax.errors import CheckpointError
from transformer_jax.base.files import absolute, exists, is_local
from transformer_jax.checkpoints.integrity import check_shapes
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.checkpoints.saved_run import Run


def select_steps(checkpointer: Checkpointer, spec: str | int, average_last: int = 5) -> list[int]:
    """Steps named by `spec`: "latest", "best", a step (an int, or its digits), "average:N" (the last N) or
    "average" (the last `average_last`)."""
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        spec = str(int(spec))  # Translator(run, checkpoint=300), as --checkpoint=300
    if not isinstance(spec, str):
        raise CheckpointError(f"checkpoint={spec!r} is not latest, best, average:N, average or a step (an int); "
                              "pass one of them")
    steps = checkpointer.steps()
    if not steps:
        raise CheckpointError(
            f"no checkpoint in {checkpointer.directory}; train first (train.py) or pass another --workdir"
        )
    listing = f"available steps: {', '.join(map(str, steps))}"
    if spec == "latest":
        return [steps[-1]]
    if spec == "best":
        best = checkpointer.best_step()
        if best is None:
            raise CheckpointError(f"no checkpoint in {checkpointer.directory} has a dev metric; {listing}")
        return [best]
    if spec == "average":
        spec = f"average:{average_last}"
    if spec.startswith("average:"):
        count = spec.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise CheckpointError(f"--checkpoint={spec}: N must be a positive integer, e.g. average:5")
        if int(count) > len(steps):
            raise CheckpointError(f"--checkpoint={spec} asks for {count} checkpoints but {listing}")
        return steps[-int(count):]
    if spec.isdigit() and int(spec) in steps:
        return [int(spec)]
    raise CheckpointError(f"--checkpoint={spec} is not latest, best, average:N or a saved step; {listing}")


def checkpoint_params(run: Run, steps: list[int]) -> Any:
    """The parameters of one step, or the element-wise mean over several (checkpoint averaging)."""
    total = None
    for step in steps:
        params = run.checkpointer.restore_params(step)
        check_param_shapes(run, params, step)
        params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
        total = params if total is None else jax.tree.map(np.add, total, params)
    return jax.tree.map(lambda x: (x / len(steps)).astype(np.float32), total)


def check_param_shapes(run: Run, params: Any, step: int) -> None:
    """Fail clearly when saved parameter shapes differ from what the run's config.json builds."""
    from transformer_jax.model.transformer import Transformer

    dummy = jax.numpy.ones((1, 4), jax.numpy.int32)
    shapes_of = run.model_config.replace(attention_backend="einsum")  # the same parameters; runs on any platform
    expected = jax.eval_shape(lambda: Transformer(shapes_of).init(jax.random.key(0), dummy, dummy)["params"])
    check_shapes(params, expected, f"checkpoint {run.checkpointer.directory}/{step}")


def write_params(params: Any, path: str) -> None:
    """Save parameters alone (e.g. an averaged model) as an Orbax checkpoint at `path`.

    A save that fails (a full disk, a read-only file system) removes what it wrote, so that the same
    command can run again, and raises the OSError naming `path` (TensorStore reports it as a ValueError
    holding the error number).
    """
    if exists(path):
        raise CheckpointError(f"{path} already exists; choose another path or remove it")
    if is_local(path):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as error:
            raise CheckpointError(f"cannot write {path} ({error.strerror or error}); choose another path") from None
    # Synchronous: a failed asynchronous save leaves threads waiting 5 minutes for a signal before the process ends.
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    try:
        with _failed_writes_unlogged():
            checkpointer.save(absolute(path), args=ocp.args.StandardSave(params))
    except Exception as error:
        if is_local(path) and jax.process_index() == 0:  # the process that wrote it
            for written in [path, *glob.glob(glob.escape(path) + ".orbax-checkpoint-tmp*")]:
                shutil.rmtree(written, ignore_errors=True)
        fault = _os_error(error)
        if fault is None:
            raise
        raise OSError(fault.errno, fault.strerror, path) from error


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind a failed Orbax save: raised as is, or a TensorStore error holding "os_error_code='28'"."""
    for cause in (error, error.__cause__, error.__context__):
        if isinstance(cause, OSError) and cause.errno:
            return cause
        found = re.search(r"os_error_code='?(\d+)", str(cause)) if cause is not None else None
        if found:
            return OSError(int(found[1]), os.strerror(int(found[1])))
    return None


@contextlib.contextmanager
def _failed_writes_unlogged() -> Iterator[None]:
    """Orbax logs a failed background write (traceback and all) before it raises it again: the raise is
    reported once, by the caller, so its log records are dropped while it saves."""
    logger = absl_logging.get_absl_logger()
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
