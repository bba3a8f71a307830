"""Writing a prepared corpus (its format: prepared.py): the training pairs encoded into token shards by worker
processes, then the length index, the dev/test text and, last, the manifest.

`check_can_write` refuses, before any work, a directory that holds anything but a prepared corpus's files (nothing is
overwritten) or that cannot be made; `write_prepared` writes the corpus, `finish_prepared` its index, splits and
manifest for shards already written (the benchmarks' synthetic corpora write their shards themselves).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import hashlib
import io
import json
import logging
import math
import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import (exists, is_dir, is_local, list_names, make_dirs, read_bytes, storage_named,
                                        write_atomically)
from transformer_jax.data.encoded import EncodedPairs, encode_pairs
from transformer_jax.data.prepared import (
    EVAL_SPLITS,
    FORMAT,
    INDEX,
    MANIFEST,
    PreparedCorpus,
    check_owned_names,
    owned_name,
    pair_checksums,
    shard_name,
)
from transformer_jax.data.sources import Pair
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import DataError, WorkerError

SHARD_PAIRS = 1_000_000  # pairs per shard: the unit one preparing worker encodes and writes

_WORKER_TOKENIZER: dict[str, Tokenizer] = {}


def encode_shard(tokenizer_path: str, pairs: Sequence[Pair], path: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Encode `pairs` and write their ids to the shard `path`; returns their source and target lengths."""
    tokenizer = _WORKER_TOKENIZER.get(tokenizer_path)
    if tokenizer is None:
        tokenizer = _WORKER_TOKENIZER[tokenizer_path] = Tokenizer.load(tokenizer_path)
    encoded = encode_pairs(list(pairs), tokenizer)
    write_shard(path, encoded, dtype)
    return encoded.source.lengths, encoded.target.lengths


def write_shard(path: str, pairs: EncodedPairs, dtype: str) -> None:
    """Write the ids of `pairs` to `path` (atomically), pair after pair: source ids, then target ids."""
    source, target = pairs.source, pairs.target
    totals = source.lengths.astype(np.int64) + target.lengths
    starts = np.cumsum(totals) - totals
    values = np.empty(int(totals.sum()), np.dtype(dtype).newbyteorder("<"))
    for side, shift in ((source, 0), (target, source.lengths.astype(np.int64))):
        within = np.arange(int(side.lengths.sum())) - np.repeat(np.cumsum(side.lengths, dtype=np.int64) - side.lengths,
                                                                side.lengths)
        values[np.repeat(starts + shift, side.lengths) + within] = side.values[np.repeat(side.starts, side.lengths) + within]
    write_atomically(path, values.tobytes())


def shard_dtype(vocab_size: int) -> str:
    """Two bytes a token when the vocabulary allows it (37k pieces do), else four."""
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"


def write_prepared(directory: str, key: dict[str, Any], tokenizer_path: str, train: list[Pair],
                   splits: dict[str, list[Pair]], workers: int = 1, shard_pairs: int = SHARD_PAIRS,
                   test_is_dev: bool = False, workers_flag: str = "--config.data.prepare_workers") -> PreparedCorpus:
    """Encode `train` into shards with `workers` processes, then write the index, the splits and the manifest.

    `tokenizer_path` is copied to the corpus unless it is already there. `train` is emptied shard by
    shard as it is handed out, so the text and the shards are never both whole in this process.
    A write the storage refuses (a full disk) is a StorageError, a worker killed (by hand, or for memory) a
    WorkerError whose advice names `workers_flag`, the command's flag setting `workers`: what was written is no
    corpus until the manifest is, and preparing again overwrites it.
    """
    with storage_named(f"preparing the corpus in {directory}", "run the same command again: it prepares the corpus anew"):
        try:
            return _write_prepared(directory, key, tokenizer_path, train, splits, workers, shard_pairs, test_is_dev)
        except concurrent.futures.process.BrokenProcessPool:
            fewer = f"with fewer workers ({workers_flag}={max(1, workers // 2)})"
            raise WorkerError(f"a preparation worker stopped (killed, or out of memory?), so the corpus in {directory} "
                              f"is not prepared (it has no {MANIFEST}); run the same command again, or {fewer}") from None


def _write_prepared(directory: str, key: dict[str, Any], tokenizer_path: str, train: list[Pair],
                    splits: dict[str, list[Pair]], workers: int, shard_pairs: int, test_is_dev: bool) -> PreparedCorpus:
    make_dirs(directory)
    tokenizer = Tokenizer.load(tokenizer_path)
    dtype = shard_dtype(tokenizer.vocab_size)
    own_tokenizer = os.path.join(directory, layout.TOKENIZER)
    if os.path.normpath(tokenizer_path) != os.path.normpath(own_tokenizer):
        write_atomically(own_tokenizer, read_bytes(tokenizer_path))
    count = max(1, math.ceil(len(train) / shard_pairs))
    names = [shard_name(index, count) for index in range(count)]

    def shards() -> Any:
        for name in names:
            shard = train[:shard_pairs]
            del train[:shard_pairs]
            yield shard, os.path.join(directory, name)

    if workers <= 1:
        lengths = [encode_shard(own_tokenizer, shard, path, dtype) for shard, path in shards()]
    else:
        # Spawned workers: the parent may already run JAX's threads, which a fork would copy half-held.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(encode_shard, own_tokenizer, shard, path, dtype) for shard, path in shards()]
            lengths = [future.result() for future in futures]
    return finish_prepared(directory, key, tokenizer, names, lengths, splits, dtype, test_is_dev)


def finish_prepared(directory: str, key: dict[str, Any], tokenizer: Tokenizer, names: list[str],
                    lengths: list[tuple[np.ndarray, np.ndarray]], splits: dict[str, list[Pair]],
                    dtype: str, test_is_dev: bool = False) -> PreparedCorpus:
    """Write the length index, the dev/test text and, last, the manifest of shards already written
    (`test_is_dev`: the source had no test split, and its dev pairs stand in; the manifest says so)."""
    source = np.concatenate([pair[0] for pair in lengths]).astype(np.int32)
    target = np.concatenate([pair[1] for pair in lengths]).astype(np.int32)
    # Each pair's checksum, from the shards as written (read back once, in order).
    checksums = []
    for name, (shard_source, shard_target) in zip(names, lengths):
        values = np.frombuffer(read_bytes(os.path.join(directory, name)), np.dtype(dtype).newbyteorder("<"))
        totals = shard_source.astype(np.int64) + shard_target
        checksums.append(pair_checksums(values, np.cumsum(totals) - totals, totals))
    buffer = io.BytesIO()
    np.savez(buffer, source_lengths=source, target_lengths=target, pair_checksums=np.concatenate(checksums))
    write_atomically(os.path.join(directory, INDEX), buffer.getvalue())
    split_sha256 = {}
    for split in EVAL_SPLITS:
        content = json.dumps(splits[split], ensure_ascii=False).encode()
        write_atomically(os.path.join(directory, f"{split}.json"), content)
        split_sha256[split] = hashlib.sha256(content).hexdigest()
    itemsize = np.dtype(dtype).itemsize
    shards = [{"name": name, "pairs": len(pair[0]), "bytes": int(pair[0].sum() + pair[1].sum()) * itemsize}
              for name, pair in zip(names, lengths)]
    manifest = {"format": FORMAT, "key": key, "tokenizer": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                "pairs": len(source), "dtype": dtype, "shards": shards,
                "index_sha256": hashlib.sha256(buffer.getvalue()).hexdigest(),
                "splits": {split: len(splits[split]) for split in EVAL_SPLITS}, "splits_sha256": split_sha256,
                "test_is_dev": test_is_dev}
    write_atomically(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    logging.info("prepared %d training pairs in %d shard(s) at %s", len(source), len(names), directory)
    return PreparedCorpus.open(directory)


def check_can_write(directory: str, flag: str = "") -> list[str]:
    """Refuse to prepare into a directory holding files that are not a prepared corpus's (nothing is overwritten),
    or one that cannot be made (a file stands where it or a folder above it belongs); `flag` is the command's flag
    naming it (prepare's --output), for the advice. Returns the local directories preparing makes, deepest first."""
    elsewhere = f"another {flag}" if flag else "another directory"
    if not exists(directory):
        missing = [os.path.abspath(directory)] if is_local(directory) else []
        parent = os.path.dirname(directory.rstrip("/"))
        while is_local(directory) and parent and not exists(parent) and parent != os.path.dirname(parent):
            missing.append(os.path.abspath(parent))
            parent = os.path.dirname(parent)
        if is_local(directory) and parent and exists(parent) and not is_dir(parent):
            raise DataError(f"{parent} is a file, so the prepared corpus cannot be made at {directory}; choose "
                            f"{elsewhere if flag else 'a directory'} that is not under a file")
        return missing
    if not is_dir(directory):
        raise DataError(f"{directory} is a file, not the directory a prepared corpus is; move it away or choose "
                        f"{elsewhere}")
    others = sorted(name for name in list_names(directory) if not owned_name(name.rstrip("/")))
    if others:
        raise DataError(f"{directory} holds other files ({', '.join(others[:3])}); prepare the corpus into an "
                        f"empty or new directory{f' ({elsewhere})' if flag else ''}")
    check_owned_names(directory)
    return []
