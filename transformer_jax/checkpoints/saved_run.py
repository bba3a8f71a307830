"""A training run on disk (`Run`: its config, model config, tokenizer and a read-only checkpointer), reopened by
`open_run` with every missing or mismatched piece named; `run_config_of` reads its config alone."""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import is_dir, is_file, list_names
from transformer_jax.checkpoints.manager import Checkpointer, best_metric_for
from transformer_jax.config.schema import model_config, read_run_config
from transformer_jax.data.pipeline import corpus_directory
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import CheckpointError
from transformer_jax.model.config import TransformerConfig


@dataclasses.dataclass
class Run:
    """A training run on disk."""

    workdir: str
    config: ml_collections.ConfigDict
    model_config: TransformerConfig
    tokenizer: Tokenizer
    checkpointer: Checkpointer


def run_config_of(workdir: str) -> ml_collections.ConfigDict:
    """`<workdir>/config.json` alone (no tokenizer, checkpoint or model): a missing workdir or config named as
    open_run names it."""
    if not workdir or not workdir.strip():
        raise CheckpointError("the workdir is empty; pass the --workdir a training run wrote")
    config_path = layout.run_path(workdir, layout.CONFIG)
    if is_file(workdir):
        raise CheckpointError(f"workdir {workdir} is a file, not a directory; pass the --workdir a training run wrote")
    if not is_dir(workdir):
        raise CheckpointError(f"workdir {workdir} does not exist; pass the --workdir a training run wrote")
    if not is_file(config_path):
        present = ", ".join(sorted(list_names(workdir))) or "nothing"
        raise CheckpointError(
            f"{workdir} holds no training run (no config.json; it contains: {present}); "
            "pass the --workdir given to train.py"
        )
    return read_run_config(config_path)


def open_run(workdir: str) -> Run:
    """Load `<workdir>/config.json`, the tokenizer and the checkpoint manager; fail clearly if absent."""
    config = run_config_of(workdir)
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
