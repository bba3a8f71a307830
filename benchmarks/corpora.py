"""The data the sections time on: a random full batch, WMT-like random corpora (in memory, prepared on disk, or
as text), and the built-in corpus tokenized."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

import numpy as np

from transformer_jax.base import workdir as layout
from transformer_jax.config import default_config
from transformer_jax.data import (
    SHARD_PAIRS,
    EncodedPairs,
    Ragged,
    Tokenizer,
    finish_prepared,
    prepare_data,
    shard_dtype,
    shard_name,
    write_shard,
)
from transformer_jax.model import BOS_ID, EOS_ID


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A full (unpadded) batch of random ids, targets shifted right after BOS."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, vocab, size=(rows, length), dtype=np.int32)
    shifted = np.concatenate([np.full((rows, 1), BOS_ID, np.int32), tokens[:, :-1]], axis=1)
    return {"inputs": tokens, "targets": tokens, "target_inputs": shifted}


def wmt_like_lengths(rng: np.random.Generator, num_pairs: int, median: float = 23,
                     longest: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths like WMT's: lognormal sources, targets about 10% longer (mean about 27 tokens
    with the defaults)."""
    source_lengths = np.clip(rng.lognormal(np.log(median), 0.55, num_pairs), 2, longest).astype(int)
    target_lengths = np.clip(source_lengths * rng.lognormal(0.1, 0.15, num_pairs), 2, longest).astype(int)
    return source_lengths, target_lengths


def wmt_like_corpus(num_pairs: int, seed: int = 0, median: float = 23, longest: int = 256,
                    vocab: int = 32_000) -> EncodedPairs:
    """Random ids below `vocab` with WMT-like lengths (`wmt_like_lengths`).

    The defaults give a mean of about 27 tokens, at most 256; `median=10` gives short sentences
    (mean about 12 tokens, like a small EN-DE corpus of everyday sentences).
    """
    rng = np.random.default_rng(seed)
    lengths = wmt_like_lengths(rng, num_pairs, median, longest)
    return EncodedPairs(*(random_ids(rng, side, vocab) for side in lengths))


def random_ids(rng: np.random.Generator, lengths: np.ndarray, vocab: int = 32_000) -> Ragged:
    """Sequences of random ids below `vocab` of the given lengths, each ending in EOS."""
    values = rng.integers(4, vocab, int(lengths.sum()), dtype=np.int32)
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
        return prepare_data(config, workdir).train.corpus.read_all()  # in memory: the directory goes


def write_wmt_like_prepared(directory: str, num_pairs: int, tokenizer_path: str, longest: int = 1024,
                            shard_pairs: int = SHARD_PAIRS) -> None:
    """A prepared corpus (data/prepared.py's format) of `num_pairs` random WMT-like pairs, written shard by shard.

    The ids are random below the tokenizer's vocabulary (the tokenizer is recorded, never run), so making
    10M pairs takes a minute and never holds more than one shard. `longest=1024` leaves a few pairs (about
    6 in a million) longer than 256 tokens, as a real corpus has, for a run's length filter to drop.
    """
    os.makedirs(directory, exist_ok=True)
    shutil.copy(tokenizer_path, os.path.join(directory, layout.TOKENIZER))
    tokenizer = Tokenizer.load(tokenizer_path)
    dtype = shard_dtype(tokenizer.vocab_size)
    count = -(-num_pairs // shard_pairs)
    names, lengths = [shard_name(index, count) for index in range(count)], []
    for index, name in enumerate(names):
        shard = wmt_like_corpus(min(shard_pairs, num_pairs - index * shard_pairs), seed=index, longest=longest,
                                vocab=tokenizer.vocab_size)
        write_shard(os.path.join(directory, name), shard, dtype)
        lengths.append((shard.source.lengths, shard.target.lengths))
    finish_prepared(directory, {"synthetic": "WMT-like random ids", "pairs": num_pairs}, tokenizer, names, lengths,
                    {"dev": [], "test": []}, dtype)


def write_wmt_like_text(directory: str, num_pairs: int, seed: int = 0, words: int = 20_000,
                        eval_pairs: int = 500) -> None:
    """Line-aligned text files train/dev/test.en/.de (the "text" source's layout) of random pseudo-words with
    WMT-like lengths in words (`wmt_like_lengths`, median 20).

    The words come from a fixed vocabulary of `words` distinct pseudo-words at Zipf frequencies (the n-th
    most common 1/n as often as the first), so a SentencePiece model of 8,000 pieces keeps the common words
    whole and splits the rare ones (about 1.1 pieces a word), as a real tokenizer does.
    """
    rng = np.random.default_rng(seed)
    syllables = np.array("ka te ri mo su len der ung sch ein the and ion er ba lo ni vu ist gen pra tor men ha wi zu "
                         "ge ver ab ol".split())
    candidates = ["".join(rng.choice(syllables, rng.integers(1, 6))) for _ in range(3 * words)]
    vocabulary = np.array(list(dict.fromkeys(candidates))[:words])  # distinct, in the order drawn
    frequency = 1 / np.arange(1, len(vocabulary) + 1)
    os.makedirs(directory, exist_ok=True)
    for split, size in (("train", num_pairs), ("dev", eval_pairs), ("test", eval_pairs)):
        for language, lengths in zip(("en", "de"), wmt_like_lengths(rng, size, median=20, longest=200)):
            ids = rng.choice(len(vocabulary), int(lengths.sum()), p=frequency / frequency.sum())
            ends = np.cumsum(lengths)
            with open(os.path.join(directory, f"{split}.{language}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(vocabulary[ids[end - length:end]]) + "\n" for end, length in zip(ends, lengths))
