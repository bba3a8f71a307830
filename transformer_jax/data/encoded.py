"""A tokenized parallel corpus held in flat int32 arrays: tokenized once, read by the batchers."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from transformer_jax.data.tokenizer import EOS_ID, Tokenizer
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


def encode_pairs(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer) -> EncodedPairs:
    """Tokenize (source, target) pairs once into flat int32 arrays, appending EOS to each side."""
    sides = []
    for side in (0, 1):
        ids = tokenizer.encode_batch([pair[side] for pair in pairs])
        sides.append(Ragged.from_lists([sequence + [EOS_ID] for sequence in ids]))
    return EncodedPairs(*sides)


def filter_by_length(corpus: EncodedPairs, max_length: int) -> tuple[EncodedPairs, int]:
    """Training only: drop pairs with a side longer than max_length tokens; returns the number dropped."""
    keep = np.flatnonzero((corpus.source.lengths <= max_length) & (corpus.target.lengths <= max_length))
    if len(keep) == 0:
        raise DataError(f"no training pair fits max_length={max_length} tokens; raise max_length")
    return corpus.select(keep), len(corpus) - len(keep)
