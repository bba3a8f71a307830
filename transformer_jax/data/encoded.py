"""A tokenized parallel corpus held in flat int32 arrays: tokenized once, read by the batchers."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer_jax.data.tokenizer import Tokenizer

from transformer_jax.model.special_tokens import EOS_ID
from transformer_jax.errors import DataError


@dataclasses.dataclass(frozen=True)
class Ragged:
    """Variable-length int32 sequences stored flat: sequence i is values[starts[i]:starts[i] + lengths[i]]."""

    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]]) -> Ragged:
        """Pack a list of id lists."""
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        values = np.fromiter((t for s in sequences for t in s), dtype=np.int32, count=int(lengths.sum()))
        starts = np.cumsum(lengths) - lengths
        return cls(values, starts, lengths.astype(np.int32))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.starts[index]:self.starts[index] + self.lengths[index]]

    def select(self, indices: np.ndarray) -> Ragged:
        """The sequences at `indices`, in that order (values are shared, not copied)."""
        return Ragged(self.values, self.starts[indices], self.lengths[indices])


@dataclasses.dataclass(frozen=True)
class EncodedPairs:
    """A tokenized parallel corpus; both sides end with EOS, the source has no BOS."""

    source: Ragged
    target: Ragged

    def __len__(self) -> int:
        return len(self.source)

    def select(self, indices: np.ndarray) -> EncodedPairs:
        """The pairs at `indices`."""
        return EncodedPairs(self.source.select(indices), self.target.select(indices))

    def read(self, items: np.ndarray) -> EncodedPairs:
        """The pairs at `items`, in that order (what batching reads; a prepared corpus reads them from disk)."""
        return self.select(items)


def encode_pairs(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, chunk_size: int = 50_000,
                 consume: bool = False) -> EncodedPairs:
    """Tokenize (source, target) pairs once into flat int32 arrays, appending EOS to each side.

    Encoded `chunk_size` pairs at a time, each chunk turned into arrays at once: the peak memory is
    the final arrays plus one chunk's Python id lists (a whole corpus's lists take ~10x its arrays).
    With `consume`, `pairs` (a list) is emptied chunk by chunk, so the text and the arrays are never
    both whole in memory.
    """
    chunks: tuple[list[Ragged], list[Ragged]] = ([], [])
    start = 0
    while start < len(pairs):
        chunk = pairs[start:start + chunk_size]
        for side, parts in enumerate(chunks):
            parts.append(_with_eos(tokenizer.encode_batch([pair[side] for pair in chunk], target=side == 1)))
        if consume:
            del pairs[:chunk_size], chunk  # type: ignore[attr-defined]
        else:
            start += chunk_size
    return EncodedPairs(*(concatenate(parts) for parts in chunks))


def _with_eos(sequences: list[list[int]]) -> Ragged:
    """Flat arrays of id lists, each followed by EOS."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences)) + 1
    ends = np.cumsum(lengths)
    values = np.full(int(ends[-1]) if len(ends) else 0, EOS_ID, dtype=np.int32)
    is_token = np.ones(len(values), dtype=bool)
    is_token[ends - 1] = False
    values[is_token] = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int32,
                                   count=int(lengths.sum() - len(lengths)))
    return Ragged(values, ends - lengths, lengths.astype(np.int32))


def concatenate(parts: Sequence[Ragged]) -> Ragged:
    """One Ragged holding the sequences of `parts` in order (each part's values contiguous)."""
    if not parts:
        return Ragged(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int32))
    lengths = np.concatenate([part.lengths for part in parts])
    starts = np.cumsum(lengths, dtype=np.int64) - lengths
    values = np.concatenate([part.values for part in parts])
    return Ragged(values, starts, lengths)


def filter_by_length(corpus: EncodedPairs | Any, max_length: int) -> tuple[Any, int]:
    """Training only: drop pairs with a side longer than max_length tokens; returns the number dropped.

    Reads lengths only, so it serves a prepared corpus (whose `select` reads nothing) as well.
    """
    keep = np.flatnonzero((corpus.source.lengths <= max_length) & (corpus.target.lengths <= max_length))
    if len(keep) == 0:
        raise DataError(f"no training pair fits max_length={max_length} tokens; raise --config.data.max_length")
    if len(keep) == len(corpus):
        return corpus, 0  # no copy of a large corpus's index
    return corpus.select(keep), len(corpus) - len(keep)
