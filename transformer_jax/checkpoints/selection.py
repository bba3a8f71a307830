"""Reopening a finished or running training run: its config, tokenizer and checkpoints, and averaging them."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import numbers
import os
import re
import shutil
from typing import Any, Iterator

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from transformer_jax.data.pipeline import corpus_directory
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import CheckpointError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.config.schema import model_config, read_run_config
from transformer_jax.base.files import absolute, exists, is_dir, is_file, is_local, list_names
from transformer_jax.checkpoints.integrity import check_shapes
from transformer_jax.checkpoints.manager import Checkpointer, best_metric_for
from transformer_jax.base import workdir as layout


@dataclasses.dataclass
class Run:
    """A training run on disk."""

    workdir: str
    config: ml_collections.ConfigDict
    model_config: TransformerConfig
    tokenizer: Tokenizer
    checkpointer: Checkpointer


def open_run(workdir: str) -> Run:
    """Load `<workdir>/config.json`, the tokenizer and the checkpoint manager; fail clearly if absent."""
    config_path = layout.run_path(workdir, layout.CONFIG)
    if workdir and is_file(workdir):
        raise CheckpointError(f"workdir {workdir} is a file, not a directory; pass the --workdir a training run wrote")
    if not workdir or not is_dir(workdir):
        raise CheckpointError(f"workdir {workdir} does not exist; pass the --workdir a training run wrote")
    if not is_file(config_path):
        present = ", ".join(sorted(list_names(workdir))) or "nothing"
        raise CheckpointError(
            f"{workdir} holds no training run (no config.json; it contains: {present}); "
            "pass the --workdir given to train.py"
        )
    config = read_run_config(config_path)
    # A damaged tokenizer.model is named with the fix: the copy its prepared corpus keeps, when intact.
    corpus = corpus_directory(config, workdir)
    tokenizer = Tokenizer.load(layout.run_path(workdir, layout.TOKENIZER), copies=[os.path.join(corpus, layout.TOKENIZER)])
    check_tokenizer_of_corpus(tokenizer, layout.run_path(workdir, layout.TOKENIZER), corpus)
    directory = layout.run_path(workdir, layout.CHECKPOINTS)
    if not is_dir(directory):
        raise CheckpointError(f"no checkpoint in {directory}; train first (train.py) or pass another --workdir")
    checkpointer = Checkpointer(directory, best_metric=best_metric_for(config.training.bleu_every)[0],
                                best_mode=best_metric_for(config.training.bleu_every)[1],
                                asynchronous=False, read_only=True)
    return Run(workdir, config, model_config(config, tokenizer.vocab_size), tokenizer, checkpointer)


def check_tokenizer_of_corpus(tokenizer: Tokenizer, path: str, corpus: str) -> None:
    """CheckpointError when the run's tokenizer is not the one its prepared corpus (which the model was trained
    on) was encoded with, e.g. a tokenizer.model copied over from another run: every score would be wrong."""
    from transformer_jax.data.prepared import MANIFEST, read_manifest

    if not is_file(os.path.join(corpus, MANIFEST)):
        return  # a run whose corpus lies elsewhere (data.prepared not reachable here): nothing to compare with
    trained_with = read_manifest(corpus)["tokenizer"]
    if tokenizer.fingerprint != trained_with:
        raise CheckpointError(f"{path} is not the tokenizer this run was trained with (the one of {corpus}); copy "
                              f"{os.path.join(corpus, layout.TOKENIZER)} to {path}")


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
