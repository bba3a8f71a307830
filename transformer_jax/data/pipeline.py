"""From a run config to what training and evaluation read: the tokenizer, training batches, dev/test sets."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
from typing import Any

import ml_collections
import numpy as np

from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, encode_pairs, filter_by_length
from transformer_jax.data.corpus_writer import check_can_write, write_prepared
from transformer_jax.data.prepared import MANIFEST, PreparedCorpus, corpus_fix, read_split
from transformer_jax.data.row_width import choose_packed_rows
from transformer_jax.data.shapes import (
    WIDTH_MULTIPLE,
    width_multiple,
    BatchShapes,
    TranslationBatching,
    loss_widths,
    round_rows,
    translation_rows,
    translation_widths,
    widest_translation_width,
)
from transformer_jax.data.sources import Pair, drop_empty_pairs, load_splits
from transformer_jax.data.tokenizer import Tokenizer, sample_sentences, train_tokenizer
from transformer_jax.errors import DataError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.base.files import exists, is_file, is_local, read_bytes, write_atomically
from transformer_jax.base import workdir as layout
from transformer_jax.base.lock import Claim, WorkdirLockedError


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
    test_is_dev: bool = False  # the source had no test split: `test` holds the dev pairs (label its scores "dev")

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
        tsv_columns=data.tsv_columns,
        seed=seed,
    )


def eval_set(pairs: list[Pair], tokenizer: Tokenizer) -> EvalSet:
    """Tokenize a dev/test split, keeping every pair (empty ones too) in order."""
    return EvalSet(pairs, encode_pairs(pairs, tokenizer))


def training_rows(config: ml_collections.ConfigDict, train: EncodedPairs, vocab_size: int,
                  row_multiple: int, multiple: int = WIDTH_MULTIPLE) -> tuple[int, dict[int, int] | None]:
    """The packed row width and the global rows per batch of each width used (None: tokens_per_batch // width).

    data.row_width (at most max_length) keeps rows of tokens_per_batch slots; 0 chooses the width from
    the training corpus for this model and sizes each width's rows by real tokens (row_width.py).
    """
    data = config.data
    if data.row_width or not data.pack:
        return min(data.row_width or data.max_length, data.max_length), None
    layout = choose_packed_rows(train, TransformerConfig.for_run(config.model, vocab_size, data.max_length), data.tokens_per_batch, data.max_length,
                                row_multiple, multiple=multiple)
    shapes = ", ".join(f"{rows}x{width} ({layout.fills[width]:.0%} of slots real)"
                       for width, rows in layout.rows.items())
    logging.info("packed batches of %s (rows x tokens), chosen from the corpus to hold as many real tokens as "
                 "rows of data.max_length=%d would (%.0f%% real)", shapes, data.max_length, 100 * layout.reference_fill)
    return layout.width, layout.rows


def corpus_key(data: ml_collections.ConfigDict, seed: int) -> dict[str, Any]:
    """What a prepared corpus depends on: the source, its splits and files, and the tokenizer's settings."""
    key: dict[str, Any] = {name: data[name] for name in CORPUS_SETTINGS}
    if data.path and is_local(data.path):  # where it is, whatever directory the command was started from
        key["path"] = os.path.abspath(data.path)
    if data.source == "builtin":  # the built-in corpus is generated and split from the seed
        key.update({name: data[name] for name in BUILTIN_SETTINGS}, seed=seed)
    if data.source == "tsv" and data.tsv_columns:  # (absent when unset: corpora prepared before it keep their key)
        key["tsv_columns"] = data.tsv_columns
    if data.source in ("text", "tsv") and data.path and is_local(data.path) and os.path.isdir(data.path):
        # Each file's size, modification time and content (SHA-256, streamed: about a second a gigabyte): an edited
        # corpus is a changed corpus, whatever its size and time say (`cp -p` and `rsync -t` keep the time).
        key["files"] = sorted([entry.name, entry.stat().st_size, entry.stat().st_mtime_ns, _file_sha256(entry.path)]
                              for entry in os.scandir(data.path) if entry.is_file())
    return key


def _file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def changed_files(saved: list[list[Any]], now: list[list[Any]]) -> list[str]:
    """The names of the data files that differ between two corpus keys' "files": by content (name, size and
    SHA-256) where both have it; a key of a corpus prepared before contents were kept compares sizes and times."""
    def identity(entry: list[Any], with_content: bool) -> tuple:
        return (entry[0], entry[1], entry[3]) if with_content else (entry[0], entry[1], entry[2])

    with_content = all(len(entry) > 3 for entry in saved)
    before = {entry[0]: identity(entry, with_content) for entry in saved}
    after = {entry[0]: identity(entry, with_content) for entry in now}
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


# The data settings a prepared corpus is made from; `path` and `tfds_data_dir` say where, the others what.
CORPUS_SETTINGS = ("source", "path", "source_lang", "target_lang", "tfds_train_name", "tfds_eval_name",
                   "tfds_data_dir", "vocab_size", "tokenizer_type", "byte_fallback")
BUILTIN_SETTINGS = ("builtin_train_size", "builtin_dev_size", "builtin_test_size")
# Where the data is read from: a corpus prepared on another machine may have read it from elsewhere.
LOCATION_SETTINGS = ("path", "tfds_data_dir", "files")


def check_corpus_key(corpus: PreparedCorpus, key: dict[str, Any], own: bool, output_flag: str = "") -> None:
    """Fail when `corpus` was prepared from other data settings than `key` (`own`: the run's own corpus in
    its workdir, or the output of a command whose flag `output_flag` names it, which also checks where the data
    lies and whether its files changed)."""
    saved = dict(corpus.manifest["key"])
    if saved.get("path") and is_local(saved["path"]):  # corpora prepared before paths were kept absolute
        saved["path"] = os.path.abspath(saved["path"])
    fix = (f"or choose another {output_flag}" if output_flag else "or use a new workdir" if own
           else "or prepare the corpus again into a new directory")
    if "files" in saved and "files" in key and (own and saved.get("path") == key.get("path") or (
            not own and all(len(entry) > 3 for entry in saved["files"]))):
        # Its own corpus: the files it was prepared from, edited since. Another (data.prepared) with a local
        # data.path: the files named are not the ones it was prepared from (by content; on another machine too).
        changed = changed_files(saved["files"], key["files"])
        if changed:
            what = "changed since" if own else "are not the ones"
            raise DataError(f"the files in data.path={key['path']} {what} {corpus.directory} was prepared from "
                            f"({', '.join(changed[:3])} differ); restore them, {fix}")
    order = [*CORPUS_SETTINGS, *BUILTIN_SETTINGS, "seed"]  # what the corpus is before how it is tokenized
    for name in sorted(set(saved) | set(key), key=lambda name: order.index(name) if name in order else len(order)):
        if name in (() if own else LOCATION_SETTINGS) + ("files",):
            continue
        if saved.get(name) != key.get(name):
            setting = "training.seed" if name == "seed" else f"data.{name}"
            raise DataError(f"{setting}={key.get(name)!r} differs from the {saved.get(name)!r} that {corpus.directory} "
                            f"was prepared with; set --config.{setting}={saved.get(name)!r}, {fix}")


def prepare_corpus(config: ml_collections.ConfigDict, directory: str, workers: int = 1,
                   tokenizer_model: str | None = None,
                   workers_flag: str = "--config.data.prepare_workers", output_flag: str = "") -> PreparedCorpus:
    """Prepare the configured training corpus into `directory` (or open it, when prepared from these settings).

    Reads the splits, trains the tokenizer (or uses `tokenizer_model`), encodes the training pairs with
    `workers` processes and writes the shards, the length index and the dev/test text (prepared.py).
    `workers_flag` is the calling command's flag that sets `workers`, for the advice when one is killed.
    `output_flag` (prepare's --output) makes `directory` a command's own output: one job prepares it at a time
    (`<directory>.lock`, as a run owns its workdir; another is refused naming it, before anything is written), and
    what a failed attempt made for it is removed (a stop keeps it: the same command prepares it anew).
    """
    key = corpus_key(config.data, config.training.seed)
    if is_file(os.path.join(directory, MANIFEST)):
        corpus = PreparedCorpus.open(directory)
        check_corpus_key(corpus, key, own=True, output_flag=output_flag)
        return corpus
    created = check_can_write(directory, output_flag)
    if not output_flag:  # the run's own corpus: its workdir's lock and lifecycle cover it
        return _prepare_corpus(config, directory, workers, tokenizer_model, workers_flag, key)
    claim = Claim(f"{directory.rstrip('/')}.lock", f"output {directory}", "job preparing a corpus", output_flag)
    try:
        claim.acquire()  # refused: another job prepares it, and nothing of it is touched here
        if is_file(os.path.join(directory, MANIFEST)):  # prepared by the job that held it until now
            return prepare_corpus(config, directory, workers, tokenizer_model, workers_flag, output_flag)
        return _prepare_corpus(config, directory, workers, tokenizer_model, workers_flag, key)
    except WorkdirLockedError:
        raise
    except Exception:
        if created and not exists(os.path.join(directory, MANIFEST)):
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost folder this attempt made
        raise
    finally:
        claim.release()


def _prepare_corpus(config: ml_collections.ConfigDict, directory: str, workers: int, tokenizer_model: str | None,
                    workers_flag: str, key: dict[str, Any]) -> PreparedCorpus:
    data = config.data
    splits = load_run_splits(data, config.training.seed, ("train", "dev", "test"))
    train_pairs, dropped = drop_empty_pairs(splits.pop("train"))
    if dropped:
        logging.warning("dropped %d training pairs with an empty side", dropped)
    if tokenizer_model is None:
        # Trained anew, never taken from the directory: without a manifest, a tokenizer there is what an interrupted
        # preparation left, perhaps of other settings (another vocab_size), which the manifest would then vouch for.
        tokenizer_model = os.path.join(directory, layout.TOKENIZER)
        sentences = sample_sentences(train_pairs, data.tokenizer_sample_size, config.training.seed)
        train_tokenizer(sentences, tokenizer_model, data.vocab_size, data.tokenizer_type, data.byte_fallback,
                        exact_size=True)
    elif (pieces := Tokenizer.load(tokenizer_model).vocab_size) != data.vocab_size:
        raise DataError(f"data.vocab_size={data.vocab_size} differs from the {pieces} "
                        f"pieces of {tokenizer_model}; set --config.data.vocab_size={pieces}")
    return write_prepared(directory, key, tokenizer_model, train_pairs, splits, workers,
                          test_is_dev=splits["test"] is splits["dev"], workers_flag=workers_flag)


def _initial_tokenizer(config: ml_collections.ConfigDict) -> str | None:
    """The tokenizer a fine-tuning run (training.init_from) encodes its corpus with: its starting run's."""
    source = config.training.init_from
    return layout.run_path(source, layout.TOKENIZER) if source else None


def corpus_directory(config: ml_collections.ConfigDict, workdir: str | None) -> str:
    """Where a run reads its prepared corpus: data.prepared, else `<workdir>/corpus` (prepared at its first start)."""
    if config.data.prepared:
        return config.data.prepared
    if not workdir:
        raise DataError("no corpus to read: set data.prepared to a prepared corpus, or give a workdir")
    return layout.run_path(workdir, layout.CORPUS)


def run_corpus(config: ml_collections.ConfigDict, workdir: str | None, process_index: int = 0,
               process_count: int = 1) -> tuple[PreparedCorpus, Tokenizer]:
    """The run's prepared training corpus and its tokenizer, also kept as `<workdir>/tokenizer.model`.

    Without data.prepared, process 0 prepares `<workdir>/corpus` at the first start while the others
    wait; then every process opens it and reads only the index until batches ask for its rows.
    Without a workdir (the preflight on data.prepared alone) nothing is written.
    """
    directory, own = corpus_directory(config, workdir), not config.data.prepared
    workdir_tokenizer = layout.run_path(workdir, layout.TOKENIZER) if workdir else None
    corpus_tokenizer = os.path.join(directory, layout.TOKENIZER)  # the copy the corpus keeps
    if own and process_index == 0:
        prepare_corpus(config, directory, config.data.prepare_workers,
                       tokenizer_model=workdir_tokenizer if exists(workdir_tokenizer) else _initial_tokenizer(config))
    if own and process_count > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("corpus prepared")
    corpus = PreparedCorpus.open(directory)
    check_corpus_key(corpus, corpus_key(config.data, config.training.seed), own)
    tokenizer = Tokenizer.load(corpus_tokenizer, copies=[workdir_tokenizer] if workdir_tokenizer else [])
    if tokenizer.fingerprint != corpus.manifest["tokenizer"]:
        raise DataError(f"{corpus_tokenizer} is not the tokenizer its corpus was prepared with; "
                        f"prepare the corpus again into a new directory")
    if tokenizer.vocab_size != corpus.manifest["vocab_size"]:
        raise DataError(f"{directory}/{MANIFEST} says vocab_size {corpus.manifest['vocab_size']}, but its tokenizer "
                        f"has {tokenizer.vocab_size} pieces (the manifest was edited); {corpus_fix(directory)}")
    if workdir_tokenizer and exists(workdir_tokenizer):
        if Tokenizer.load(workdir_tokenizer, copies=[corpus_tokenizer]).fingerprint != tokenizer.fingerprint:
            raise DataError(f"{directory} was prepared with another tokenizer than {workdir_tokenizer} (this run's); "
                            f"point data.prepared at the corpus this run started with, or use a new workdir")
    elif workdir_tokenizer and process_index == 0:
        write_atomically(workdir_tokenizer, read_bytes(corpus_tokenizer))
    return corpus, tokenizer


def run_split(config: ml_collections.ConfigDict, workdir: str, split: str) -> list[Pair]:
    """A dev/test split of a run as text pairs: from its prepared corpus when there is one, else from the source."""
    directory = corpus_directory(config, workdir)
    if is_file(os.path.join(directory, MANIFEST)):
        return read_split(directory, split)
    return load_run_splits(config.data, config.training.seed, (split,))[split]


def prepare_data(
    config: ml_collections.ConfigDict,
    workdir: str | None,
    row_multiple: int = 1,
    process_index: int = 0,
    process_count: int = 1,
    platform: str = "cpu",
) -> RunData:
    """The run's prepared corpus (prepared first when needed), its tokenizer, the training iterator, dev and test.

    `row_multiple` (the number of devices the batch is split over) divides every batch's rows; packed
    widths chosen from the corpus are multiples of the `platform`'s tile (shapes.width_multiple).
    """
    data = config.data
    corpus, tokenizer = run_corpus(config, workdir, process_index, process_count)
    train, too_long = filter_by_length(corpus, data.max_length)
    if too_long:
        logging.warning("dropped %d training pairs longer than max_length=%d", too_long, data.max_length)
    if data.tokens_per_batch < data.max_length * row_multiple:
        raise DataError(
            f"data.tokens_per_batch={data.tokens_per_batch} cannot hold one row of "
            f"max_length={data.max_length} per device ({row_multiple} devices); raise tokens_per_batch"
        )
    multiple = width_multiple(platform)
    row_width, rows_per_width = training_rows(config, train, tokenizer.vocab_size, row_multiple, multiple)
    iterator = BatchIterator(
        train,
        tokens_per_batch=data.tokens_per_batch,
        max_length=data.max_length,
        pack=data.pack,
        row_width=row_width,
        rows_per_width=rows_per_width,
        width_multiple=multiple,
        row_multiple=row_multiple,
        seed=config.training.seed,
        process_index=process_index,
        process_count=process_count,
    )
    return RunData(tokenizer, iterator, eval_set(corpus.split("dev"), tokenizer), eval_set(corpus.split("test"), tokenizer),
                   test_is_dev=corpus.manifest.get("test_is_dev", False))
