"""A prepared corpus: the training split tokenized once, as token shards and a length index read by row.

Preparing (once, on one machine, before or at a run's first start) trains the tokenizer, encodes the
training pairs into shards of raw token ids and writes a small index of their lengths (corpus_writer.py):

  manifest.json                 what it was prepared from, the shards and their sizes, the checksums of the
                                index and of dev/test (written last)
  tokenizer.model               the SentencePiece model every id was made with
  lengths.npz                   source and target length of every pair and a checksum of its ids: the index
                                (16 bytes a pair)
  train-00000-of-00004.tokens   pair after pair: source ids then target ids, each side ending in EOS
  dev.json, test.json           the dev/test pairs as text (references stay untokenized)

Every process of a run reads the index (the batch plan needs only lengths) and then only the token
ranges of the pairs in its own rows: a memory map on a local disk (or a gcsfuse mount), concurrent
byte-range reads on `gs://`. No process of a run tokenizes the training text.

Nothing damaged is used silently: the manifest holds the SHA-256 of the index and of dev.json and test.json
(checked when they are read), each shard's size (checked when the corpus is opened) and the index a checksum of
every pair's ids (`pair_checksums`), checked on the pairs each read returns, so a flipped byte anywhere in a
shard stops the run that reads it, naming the shard, without reading whole shards at start-up.

Why this format and not ArrayRecord/Grain: a pair is two short id sequences, so the flat shards and
the index are all the random access needs (fairseq's and Megatron's indexed datasets are the same
design); ArrayRecord's open-source reader opens local files only (riegeli's GCS reader is not open
source), and Grain's samplers deal records to processes one by one, while our batches are planned
over the whole corpus by token budget and dealt out as row blocks (batching.py); the background
`run.prefetch.Prefetcher` already keeps input ahead of the step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
from typing import Any

import numpy as np

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import is_dir, is_file, is_local, list_names, object_path, read_bytes, read_text
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.data.sources import Pair
from transformer_jax.errors import DataError
from transformer_jax.model.special_tokens import EOS_ID

FORMAT = "transformer_jax prepared corpus 1"
MANIFEST = "manifest.json"
INDEX = "lengths.npz"
EVAL_SPLITS = ("dev", "test")


def shard_name(index: int, count: int) -> str:
    """The file name of shard `index` of `count`."""
    return f"train-{index:05d}-of-{count:05d}.tokens"


def owned_name(name: str) -> bool:
    """Whether `name` is a file a prepared corpus consists of (the only names preparing may overwrite)."""
    return (name in (MANIFEST, INDEX, layout.TOKENIZER) or name in (f"{split}.json" for split in EVAL_SPLITS)
            or (name.startswith("train-") and name.endswith(".tokens")))


def pair_checksums(values: np.ndarray, starts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """A 64-bit checksum of each pair's ids (values[start:start + total]): sum of id x (2 x position + 1), wrapping.
    The weights are odd, so any one changed id changes its pair's checksum; a shuffle within a pair does too."""
    if not len(totals):
        return np.zeros(0, np.uint64)
    positions = np.arange(int(totals.sum()), dtype=np.int64) - np.repeat(np.cumsum(totals) - totals, totals)
    order = np.repeat(starts, totals) + positions  # where each pair's ids lie in `values`
    with np.errstate(over="ignore"):
        weighted = values[order].astype(np.int64).astype(np.uint64) * (2 * positions + 1).astype(np.uint64)
        return np.add.reduceat(weighted, np.cumsum(totals) - totals)


def corpus_fix(directory: str) -> str:
    """The repair for a damaged or changed corpus at `directory`."""
    return (f"prepare it again into a new directory (python -m transformer_jax.cli.prepare --output=DIR) and point "
            f"data.prepared there, or restore {directory} as it was prepared")


@dataclasses.dataclass(frozen=True)
class Lengths:
    """One side's sequence lengths without their tokens: the part of a side the batch plan reads."""

    lengths: np.ndarray


class PreparedCorpus:
    """The training pairs of a prepared corpus: lengths in memory, tokens read on demand by `read`.

    Works where `EncodedPairs` does for batching (`source.lengths`, `target.lengths`, `select`,
    `read`); `records_read` counts the pairs this object has read (what a process of a run reads).
    """

    def __init__(self, directory: str, manifest: dict[str, Any], source_lengths: np.ndarray,
                 target_lengths: np.ndarray, pair_ids: np.ndarray | None = None,
                 shared: dict[str, Any] | None = None) -> None:
        self.directory, self.manifest = directory, manifest
        self.source, self.target = Lengths(source_lengths), Lengths(target_lengths)
        self.pair_ids = pair_ids  # positions in the whole corpus (None: all pairs, in order)
        self._shared = shared if shared is not None else self._locate(manifest, source_lengths, target_lengths)

    @staticmethod
    def _locate(manifest: dict[str, Any], source_lengths: np.ndarray, target_lengths: np.ndarray) -> dict[str, Any]:
        """Each pair's shard and token offset in it, and the shard readers (opened on first read)."""
        counts = np.asarray([shard["pairs"] for shard in manifest["shards"]], np.int64)
        first_pair = np.concatenate([[0], np.cumsum(counts)])
        totals = source_lengths.astype(np.int64) + target_lengths
        offsets = np.cumsum(totals) - totals
        shard_of = np.repeat(np.arange(len(counts), dtype=np.int16 if len(counts) < 2**15 else np.int32), counts)
        offsets -= np.repeat((np.concatenate([[0], np.cumsum(totals)])[first_pair[:-1]]), counts)
        if len(offsets) and offsets.max() < np.iinfo(np.int32).max:
            offsets = offsets.astype(np.int32)  # offsets inside a shard: 4 bytes a pair unless a shard is huge
        return {"shard_of": shard_of, "offsets": offsets, "readers": {}, "records_read": 0}

    @classmethod
    def open(cls, directory: str) -> PreparedCorpus:
        """Open and check a prepared corpus: its manifest, index checksum and shard sizes (DataError on damage)."""
        manifest = read_manifest(directory)
        index_path = os.path.join(directory, INDEX)
        if not is_file(index_path):
            raise DataError(f"{index_path} is missing; {corpus_fix(directory)}")
        index_bytes = read_bytes(index_path)
        if hashlib.sha256(index_bytes).hexdigest() != manifest["index_sha256"]:
            raise DataError(f"{index_path} changed since the corpus was prepared (its checksum differs); "
                            f"{corpus_fix(directory)}")
        with np.load(io.BytesIO(index_bytes)) as index:
            source, target = index["source_lengths"], index["target_lengths"]
            checksums = index["pair_checksums"] if "pair_checksums" in index.files else None  # older corpora: none
        if len(source) != manifest["pairs"] or sum(s["pairs"] for s in manifest["shards"]) != manifest["pairs"]:
            raise DataError(f"{index_path} lists {len(source)} pairs where {directory}/{MANIFEST} says "
                            f"{manifest['pairs']}; {corpus_fix(directory)}")
        itemsize = np.dtype(manifest["dtype"]).itemsize
        for shard, (start, end) in zip(manifest["shards"], _shard_bounds(manifest)):
            path = os.path.join(directory, shard["name"])
            expected = int(source[start:end].sum() + target[start:end].sum()) * itemsize
            size = _size(path)
            if size is None:
                raise DataError(f"{path} is missing; {corpus_fix(directory)}")
            if size != expected or size != shard["bytes"]:
                raise DataError(f"{path} has {size} bytes where {shard['bytes']} were written; it is damaged: "
                                f"{corpus_fix(directory)}")
        corpus = cls(directory, manifest, source, target)
        corpus._shared["checksums"] = checksums
        return corpus

    def __len__(self) -> int:
        return len(self.source.lengths)

    @property
    def records_read(self) -> int:
        """Pairs read so far through this corpus and every selection of it."""
        return self._shared["records_read"]

    def select(self, indices: np.ndarray) -> PreparedCorpus:
        """The pairs at `indices`, in that order (nothing is read)."""
        ids = np.asarray(indices if self.pair_ids is None else self.pair_ids[indices])
        ids = ids.astype(np.int32 if self.manifest["pairs"] < np.iinfo(np.int32).max else np.int64, copy=False)
        return PreparedCorpus(self.directory, self.manifest, self.source.lengths[indices],
                              self.target.lengths[indices], ids, self._shared)

    def read(self, items: np.ndarray) -> EncodedPairs:
        """The token ids of the pairs at `items`, in that order: reads only those pairs' bytes."""
        items = np.asarray(items, np.int64)
        ids = items if self.pair_ids is None else self.pair_ids[items]
        source_lengths, target_lengths = self.source.lengths[items], self.target.lengths[items]
        totals = source_lengths.astype(np.int64) + target_lengths
        starts = np.cumsum(totals) - totals  # where each pair goes in the values read
        values = np.empty(int(totals.sum()), np.int32)
        shard_of, offsets = self._shared["shard_of"][ids], self._shared["offsets"][ids].astype(np.int64)
        for shard in np.unique(shard_of):
            mine = np.flatnonzero(shard_of == shard)
            self._read_shard(int(shard), offsets[mine], totals[mine], starts[mine], values)
        self._shared["records_read"] += len(items)
        source = Ragged(values, starts, source_lengths)
        target = Ragged(values, starts + source_lengths, target_lengths)
        ends = starts + totals
        damaged = (values[starts + source_lengths - 1] != EOS_ID) | (values[ends - 1] != EOS_ID)
        expected = self._shared.get("checksums")
        if expected is not None:
            damaged |= pair_checksums(values, starts, totals) != expected[ids]
        if len(items) and damaged.any():
            bad = self.manifest["shards"][int(shard_of[np.flatnonzero(damaged)[0]])]["name"]
            raise DataError(f"{self.directory}/{bad} holds tokens that do not match its index (damaged shard); "
                            f"{corpus_fix(self.directory)}")
        # An id past the vocabulary would be clamped by the embedding's gather without a word: never trained on.
        pieces = self.manifest["vocab_size"]
        if len(values) and (values.max() >= pieces or values.min() < 0):
            outside = np.flatnonzero((values >= pieces) | (values < 0))[0]
            pair = np.searchsorted(starts, outside, side="right") - 1
            bad = self.manifest["shards"][int(shard_of[pair])]["name"]
            raise DataError(f"{self.directory}/{bad} holds token id {int(values[outside])}, outside the "
                            f"{pieces} pieces of its tokenizer; {corpus_fix(self.directory)}")
        return EncodedPairs(source, target)

    def _read_shard(self, shard: int, offsets: np.ndarray, totals: np.ndarray, destinations: np.ndarray,
                    values: np.ndarray) -> None:
        """Copy the token ranges [offset, offset + total) of one shard to `values` at `destinations`."""
        path = os.path.join(self.directory, self.manifest["shards"][shard]["name"])
        dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        if is_local(path):
            # One pread per pair: a memory map would be simpler, but each page fault maps the page cache
            # around it (megabytes on some file systems), so a process's memory would grow with the corpus.
            descriptor = self._shared["readers"].get(shard)
            if descriptor is None:
                descriptor = self._shared["readers"][shard] = os.open(path, os.O_RDONLY)
            size = dtype.itemsize
            read = os.pread
            tokens = np.frombuffer(b"".join([read(descriptor, length, offset) for length, offset in
                                             zip((totals * size).tolist(), (offsets * size).tolist())]), dtype)
            firsts = np.cumsum(totals) - totals  # where each pair starts in `tokens`
            values[np.repeat(destinations - firsts, totals) + np.arange(len(tokens))] = tokens
            return
        import fsspec  # an object store: one concurrent request per pair's byte range (gcsfs for gs://)

        filesystem, _ = fsspec.core.url_to_fs(path)
        ranges = filesystem.cat_ranges([path] * len(offsets), (offsets * dtype.itemsize).tolist(),
                                       ((offsets + totals) * dtype.itemsize).tolist())
        for chunk, destination, total in zip(ranges, destinations, totals):
            values[destination:destination + total] = np.frombuffer(chunk, dtype)

    def read_all(self) -> EncodedPairs:
        """Every pair's tokens in memory (for tools and benchmarks; a run reads by row)."""
        return self.read(np.arange(len(self)))

    def split(self, name: str) -> list[Pair]:
        """The dev or test pairs stored as text beside the training shards."""
        return read_split(self.directory, name)


def read_split(directory: str, name: str) -> list[Pair]:
    """The dev or test pairs of the prepared corpus in `directory` (its index and shards are not read)."""
    path = os.path.join(directory, f"{name}.json")
    manifest = read_manifest(directory)
    expected = manifest.get("splits_sha256", {}).get(name)  # older corpora: none
    if name == "test" and manifest.get("test_is_dev"):
        logging.warning("the corpus at %s had no test split: its test split is the dev split", directory)
    try:
        content = read_bytes(path)
        pairs = json.loads(content.decode())
    except (OSError, ValueError) as error:
        raise DataError(f"{path} cannot be read ({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                        f"{corpus_fix(directory)}") from None
    problem = _split_problem(pairs)
    if problem:  # a damaged file would fail only when encoded or scored, the test split after training
        raise DataError(f"{path} is damaged ({problem}); {corpus_fix(directory)}")
    if expected is not None and hashlib.sha256(content).hexdigest() != expected:  # well-formed, yet not as written
        raise DataError(f"{path} changed since the corpus was prepared (its checksum differs); "
                        f"{corpus_fix(directory)}")
    return [tuple(pair) for pair in pairs]


def _split_problem(pairs: Any) -> str | None:
    """What is wrong with a dev/test split read from JSON (None: a non-empty list of [source, target] texts)."""
    if not isinstance(pairs, list):
        return f"it holds a JSON {type(pairs).__name__}, not a list of [source, target] pairs"
    if not pairs:
        return "it holds no pairs"
    for number, pair in enumerate(pairs, start=1):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(side, str) for side in pair)):
            return f"pair {number} is {json.dumps(pair)[:60]}, not [source, target] texts"
    return None


def _shard_bounds(manifest: dict[str, Any]) -> list[tuple[int, int]]:
    counts = np.cumsum([0] + [shard["pairs"] for shard in manifest["shards"]])
    return list(zip(counts[:-1].tolist(), counts[1:].tolist()))


def _size(path: str) -> int | None:
    if is_local(path):
        return os.path.getsize(path) if os.path.isfile(path) else None
    target = object_path(path)
    return target.stat().length if target.exists() else None


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of the prepared corpus in `directory` (DataError when there is none or it is damaged)."""
    path = os.path.join(directory, MANIFEST)
    if not is_file(path):
        check_owned_names(directory)
        raise DataError(f"{directory} is not a prepared corpus (no {MANIFEST}); prepare one with "
                        f"python -m transformer_jax.cli.prepare --config=... --output={directory}")
    try:
        manifest = json.loads(read_text(path))
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}")
        for key in ("shards", "index_sha256", "dtype", "pairs", "vocab_size"):
            manifest[key]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise DataError(f"{path} is damaged ({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                        f"{corpus_fix(directory)}") from None
    return manifest


def check_owned_names(directory: str) -> None:
    """Refuse a corpus directory where a directory stands at the name of one of a corpus's files."""
    if not is_dir(directory):
        return
    for name in sorted(name.rstrip("/") for name in list_names(directory)):
        path = os.path.join(directory, name)
        if owned_name(name) and is_dir(path):
            raise DataError(f"{path} is a directory, but a prepared corpus keeps a file of that name there; move it "
                            f"away and run the same command again (the corpus is prepared again if its "
                            f"{MANIFEST} is missing)")
