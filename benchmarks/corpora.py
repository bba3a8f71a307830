"""The data the sections time on: a random full batch, WMT-like random corpora, and the built-in corpus tokenized."""

from __future__ import annotations

import functools
import tempfile

import numpy as np

from transformer_jax.config import default_config
from transformer_jax.data import EncodedPairs, Ragged, prepare_data
from transformer_jax.model import EOS_ID


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A full (unpadded) batch of random ids, targets shifted right after BOS."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, vocab, size=(rows, length), dtype=np.int32)
    shifted = np.concatenate([np.full((rows, 1), 2, np.int32), tokens[:, :-1]], axis=1)
    return {"inputs": tokens, "targets": tokens, "target_inputs": shifted}


def wmt_like_corpus(num_pairs: int, seed: int = 0, median: float = 23, longest: int = 256) -> EncodedPairs:
    """Random ids with WMT-like lengths: lognormal source lengths, targets about 10% longer.

    The defaults give a mean of about 27 tokens, at most 256; `median=10` gives short sentences
    (mean about 12 tokens, like a small EN-DE corpus of everyday sentences).
    """
    rng = np.random.default_rng(seed)
    source_lengths = np.clip(rng.lognormal(np.log(median), 0.55, num_pairs), 2, longest).astype(int)
    target_lengths = np.clip(source_lengths * rng.lognormal(0.1, 0.15, num_pairs), 2, longest).astype(int)
    return EncodedPairs(*(random_ids(rng, lengths) for lengths in (source_lengths, target_lengths)))


def random_ids(rng: np.random.Generator, lengths: np.ndarray) -> Ragged:
    """Sequences of random ids of the given lengths, each ending in EOS."""
    values = rng.integers(4, 32_000, int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    values[ends - 1] = EOS_ID
    return Ragged(values, (ends - lengths).astype(np.int64), lengths.astype(np.int32))


@functools.cache
def builtin_encoded(vocab_size: int = 4_000, max_length: int = 64) -> EncodedPairs:
    """The built-in training split (50,000 pairs) as the data pipeline encodes it for a run: a SentencePiece
    model of `vocab_size` pieces trained on a 20,000-sentence sample, pairs longer than `max_length` dropped."""
    config = default_config()
    config.data.update(source="builtin", vocab_size=vocab_size, tokenizer_sample_size=20_000, max_length=max_length,
                       tokens_per_batch=4_096)
    with tempfile.TemporaryDirectory() as workdir:
        return prepare_data(config, workdir).train.corpus
