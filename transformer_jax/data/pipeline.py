"""From a run config to what training and evaluation read: the tokenizer, training batches, dev/test sets."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import ml_collections

from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, encode_pairs, filter_by_length
from transformer_jax.data.sources import Pair, drop_empty_pairs, load_splits
from transformer_jax.data.tokenizer import (
    MODEL_FILENAME,
    Tokenizer,
    load_or_train_tokenizer,
)
from transformer_jax.errors import DataError
from transformer_jax.run.files import is_file, read_text


@dataclasses.dataclass
class EvalSet:
    """A dev or test split: raw pairs (references stay untokenized) and their token ids."""

    pairs: list[Pair]
    encoded: EncodedPairs


@dataclasses.dataclass
class RunData:
    """The tokenizer, the training iterator and the dev/test sets of one run."""

    tokenizer: Tokenizer
    train: BatchIterator
    dev: EvalSet
    test: EvalSet


def load_run_splits(data: ml_collections.ConfigDict, seed: int, splits: tuple[str, ...]) -> dict[str, list[Pair]]:
    """The configured source's splits as (source, target) text pairs in the configured direction."""
    return load_splits(
        data.source,
        path=data.path or None,
        source_lang=data.source_lang,
        target_lang=data.target_lang,
        splits=splits,
        tfds_train_name=data.tfds_train_name,
        tfds_eval_name=data.tfds_eval_name,
        tfds_data_dir=data.tfds_data_dir or None,
        builtin_sizes=(data.builtin_train_size, data.builtin_dev_size, data.builtin_test_size),
        seed=seed,
    )


# Data settings the workdir's tokenizer.model was trained with: changing one on resume needs a new workdir.
TOKENIZER_SETTINGS = ("vocab_size", "tokenizer_type", "byte_fallback")


def check_tokenizer_settings(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Fail when the workdir's tokenizer was trained with other settings than `config` asks for.

    The settings of the run that trained it are read from `<workdir>/config.json`; without a
    tokenizer or a config.json there is nothing to compare.
    """
    saved_config = os.path.join(workdir, "config.json")
    if not (is_file(os.path.join(workdir, MODEL_FILENAME)) and is_file(saved_config)):
        return
    try:
        saved = json.loads(read_text(saved_config))["data"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        # train.py writes config.json anew; the model's own shape checks still apply.
        logging.warning("%s is damaged (%s); it is written anew from --config", saved_config,
                        (str(error).splitlines() or [type(error).__name__])[0])
        return
    for key in TOKENIZER_SETTINGS:
        if key in saved and saved[key] != config.data[key]:
            raise DataError(
                f"data.{key}={config.data[key]!r} differs from the {saved[key]!r} that {workdir}/{MODEL_FILENAME} "
                f"was trained with; resume with --config.data.{key}={saved[key]!r}, or use a new workdir"
            )


def shared_tokenizer(
    config: ml_collections.ConfigDict, workdir: str, train_pairs: list[Pair],
    process_index: int, process_count: int,
) -> Tokenizer:
    """Process 0 trains (or reuses) `<workdir>/tokenizer.model`; the others wait, then load that file.

    One file for all processes guarantees identical token ids, which the shared batch plan needs.
    """
    data = config.data
    check_tokenizer_settings(config, workdir)
    tokenizer = None
    if process_index == 0:
        tokenizer = load_or_train_tokenizer(
            workdir, train_pairs, vocab_size=data.vocab_size, model_type=data.tokenizer_type,
            byte_fallback=data.byte_fallback, sample_size=data.tokenizer_sample_size,
            seed=config.training.seed,
        )
    if process_count > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("tokenizer ready")
    return tokenizer or Tokenizer.load(os.path.join(workdir, MODEL_FILENAME))


def eval_set(pairs: list[Pair], tokenizer: Tokenizer) -> EvalSet:
    """Tokenize a dev/test split, keeping every pair (empty ones too) in order."""
    return EvalSet(pairs, encode_pairs(pairs, tokenizer))


def prepare_data(
    config: ml_collections.ConfigDict,
    workdir: str,
    row_multiple: int = 1,
    process_index: int = 0,
    process_count: int = 1,
) -> RunData:
    """Load the splits, train or reuse `<workdir>/tokenizer.model`, and build the training iterator.

    `row_multiple` (the number of devices the batch is split over) divides every batch's rows.
    """
    data = config.data
    splits = load_run_splits(data, config.training.seed, ("train", "dev", "test"))
    train_pairs, dropped = drop_empty_pairs(splits["train"])
    if dropped:
        logging.warning("dropped %d training pairs with an empty side", dropped)
    tokenizer = shared_tokenizer(config, workdir, train_pairs, process_index, process_count)
    train, too_long = filter_by_length(encode_pairs(train_pairs, tokenizer), data.max_length)
    if too_long:
        logging.warning("dropped %d training pairs longer than max_length=%d", too_long, data.max_length)
    if data.tokens_per_batch < data.max_length * row_multiple:
        raise DataError(
            f"data.tokens_per_batch={data.tokens_per_batch} cannot hold one row of "
            f"max_length={data.max_length} per device ({row_multiple} devices); raise tokens_per_batch"
        )
    iterator = BatchIterator(
        train,
        tokens_per_batch=data.tokens_per_batch,
        max_length=data.max_length,
        pack=data.pack,
        row_multiple=row_multiple,
        seed=config.training.seed,
        process_index=process_index,
        process_count=process_count,
    )
    return RunData(tokenizer, iterator, eval_set(splits["dev"], tokenizer), eval_set(splits["test"], tokenizer))
