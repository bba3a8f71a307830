"""From a run config to what training and evaluation read: the tokenizer, training batches, dev/test sets."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import ml_collections
import numpy as np

from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, encode_pairs, filter_by_length, load_encoded, save_encoded
from transformer_jax.data.row_width import choose_packed_rows
from transformer_jax.data.shapes import (
    BatchShapes,
    TranslationBatching,
    loss_widths,
    round_rows,
    translation_rows,
    translation_widths,
    widest_translation_width,
)
from transformer_jax.data.sources import Pair, drop_empty_pairs, load_splits
from transformer_jax.data.tokenizer import (
    Tokenizer,
    load_or_train_tokenizer,
)
from transformer_jax.errors import DataError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.base.files import is_file, is_local, read_text
from transformer_jax.base import workdir as layout


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

    def batch_shapes(self, eval_batch_size: int, batching: TranslationBatching, model_max_len: int,
                     row_multiple: int) -> BatchShapes:
        """The global batch shapes this corpus gives a run's programs (`row_multiple`: the mesh's devices)."""
        dev = self.dev.encoded
        longest = int(max(dev.source.lengths.max(), dev.target.lengths.max())) if len(dev) else self.train.row_width
        dev_rows = round_rows(eval_batch_size, row_multiple)
        width, long_width = loss_widths(longest, self.train.row_width)
        sources = np.concatenate([self.dev.encoded.source.lengths, self.test.encoded.source.lengths])
        widest = widest_translation_width(model_max_len)
        if len(sources):
            widest = int(translation_widths(sources, batching.batch_size, batching.batch_tokens,
                                            row_multiple=row_multiple).max())
        return BatchShapes(
            train=tuple(self.train.batch_shapes()), train_keys=self.train.batch_keys(),
            dev_loss=((dev_rows, width),) + (((dev_rows, long_width),) if long_width else ()),
            translation=(translation_rows(widest, batching.batch_size, batching.batch_tokens, row_multiple),
                         min(widest, model_max_len)))


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
    saved_config = layout.run_path(workdir, layout.CONFIG)
    if not (is_file(layout.run_path(workdir, layout.TOKENIZER)) and is_file(saved_config)):
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
                f"data.{key}={config.data[key]!r} differs from the {saved[key]!r} that {workdir}/{layout.TOKENIZER} "
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
    return tokenizer or Tokenizer.load(layout.run_path(workdir, layout.TOKENIZER))


def eval_set(pairs: list[Pair], tokenizer: Tokenizer) -> EvalSet:
    """Tokenize a dev/test split, keeping every pair (empty ones too) in order."""
    return EvalSet(pairs, encode_pairs(pairs, tokenizer))


def training_rows(config: ml_collections.ConfigDict, train: EncodedPairs, vocab_size: int,
                  row_multiple: int) -> tuple[int, dict[int, int] | None]:
    """The packed row width and the global rows per batch of each width used (None: tokens_per_batch // width).

    data.row_width (at most max_length) keeps rows of tokens_per_batch slots; 0 chooses the width from
    the training corpus for this model and sizes each width's rows by real tokens (row_width.py).
    """
    data = config.data
    if data.row_width or not data.pack:
        return min(data.row_width or data.max_length, data.max_length), None
    layout = choose_packed_rows(train, TransformerConfig.for_run(config.model, vocab_size, data.max_length), data.tokens_per_batch, data.max_length,
                                row_multiple)
    shapes = ", ".join(f"{rows}x{width} ({layout.fills[width]:.0%} of slots real)"
                       for width, rows in layout.rows.items())
    logging.info("packed batches of %s (rows x tokens), chosen from the corpus to hold as many real tokens as "
                 "rows of data.max_length=%d would (%.0f%% real)", shapes, data.max_length, 100 * layout.reference_fill)
    return layout.width, layout.rows


def encoded_corpus_key(data: ml_collections.ConfigDict, seed: int, tokenizer: Tokenizer) -> str:
    """What the encoded training corpus depends on: the tokenizer's model, the source and its files."""
    key = {"tokenizer": tokenizer.fingerprint, "source": data.source, "path": data.path,
           "source_lang": data.source_lang, "target_lang": data.target_lang, "tfds_train_name": data.tfds_train_name,
           "tfds_data_dir": data.tfds_data_dir}
    if data.source == "builtin":
        key.update(builtin_train_size=data.builtin_train_size, seed=seed)
    if data.source in ("text", "tsv") and data.path and is_local(data.path) and os.path.isdir(data.path):
        # The training files' sizes and modification times: an edited corpus is encoded again.
        key["files"] = sorted((entry.name, entry.stat().st_size, entry.stat().st_mtime_ns)
                              for entry in os.scandir(data.path) if entry.name.startswith("train"))
    return json.dumps(key, sort_keys=True)


def cached_training_corpus(config: ml_collections.ConfigDict, workdir: str
                           ) -> tuple[EncodedPairs | None, dict[str, list[Pair]], Tokenizer | None]:
    """On a resume: the workdir's encoded training corpus (made with its tokenizer and these data
    settings) and the dev/test splits, without reading or encoding the training text again.

    (None, {}, None) when there is no tokenizer yet or no encoded corpus made for these settings.
    """
    check_tokenizer_settings(config, workdir)
    if not is_file(layout.run_path(workdir, layout.TOKENIZER)):
        return None, {}, None
    tokenizer = Tokenizer.load(layout.run_path(workdir, layout.TOKENIZER))
    key = encoded_corpus_key(config.data, config.training.seed, tokenizer)
    train = load_encoded(layout.run_path(workdir, layout.ENCODED_TRAIN), key)
    if train is None:
        return None, {}, None
    logging.info("read the encoded training corpus from %s (%d pairs)", layout.ENCODED_TRAIN, len(train))
    return train, load_run_splits(config.data, config.training.seed, ("dev", "test")), tokenizer


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
    train, splits, tokenizer = cached_training_corpus(config, workdir)
    if train is None:
        splits = load_run_splits(data, config.training.seed, ("train", "dev", "test"))
        train_pairs, dropped = drop_empty_pairs(splits.pop("train"))
        if dropped:
            logging.warning("dropped %d training pairs with an empty side", dropped)
        tokenizer = shared_tokenizer(config, workdir, train_pairs, process_index, process_count)
        train = encode_pairs(train_pairs, tokenizer, consume=True)  # the text goes as the arrays grow
        if process_index == 0:
            save_encoded(layout.run_path(workdir, layout.ENCODED_TRAIN), train, encoded_corpus_key(data, config.training.seed,
                                                                                        tokenizer))
    train, too_long = filter_by_length(train, data.max_length)
    if too_long:
        logging.warning("dropped %d training pairs longer than max_length=%d", too_long, data.max_length)
    if data.tokens_per_batch < data.max_length * row_multiple:
        raise DataError(
            f"data.tokens_per_batch={data.tokens_per_batch} cannot hold one row of "
            f"max_length={data.max_length} per device ({row_multiple} devices); raise tokens_per_batch"
        )
    row_width, rows_per_width = training_rows(config, train, tokenizer.vocab_size, row_multiple)
    iterator = BatchIterator(
        train,
        tokens_per_batch=data.tokens_per_batch,
        max_length=data.max_length,
        pack=data.pack,
        row_width=row_width,
        rows_per_width=rows_per_width,
        row_multiple=row_multiple,
        seed=config.training.seed,
        process_index=process_index,
        process_count=process_count,
    )
    return RunData(tokenizer, iterator, eval_set(splits["dev"], tokenizer), eval_set(splits["test"], tokenizer))
