"""Input-pipeline throughput: tokens/s produced by BatchIterator, and its padding efficiency.

A section of benchmarks/run.py.

Two corpora: the built-in synthetic corpus (tokenized with a small SentencePiece model) and a
WMT-like length distribution (lognormal, mean about 27 tokens, at most 256). For each, packed and
bucketed batches are timed over whole epochs, planning included. "real tok/s" counts non-padding
tokens of inputs + targets, the figure to compare with what a train step consumes.
"""

from __future__ import annotations

import time

import numpy as np

from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.data.tokenizer import EOS_ID


def wmt_like_corpus(num_pairs: int, seed: int = 0, median: float = 23, longest: int = 256) -> EncodedPairs:
    """Random ids with WMT-like lengths: lognormal source lengths, targets about 10% longer.

    The defaults give a mean of about 27 tokens, at most 256; `median=10` gives short sentences
    (mean about 12 tokens, like a small EN-DE corpus of everyday sentences).
    """
    rng = np.random.default_rng(seed)
    source_lengths = np.clip(rng.lognormal(np.log(median), 0.55, num_pairs), 2, longest).astype(int)
    target_lengths = np.clip(source_lengths * rng.lognormal(0.1, 0.15, num_pairs), 2, longest).astype(int)
    return EncodedPairs(*(_random_ids(rng, lengths) for lengths in (source_lengths, target_lengths)))


def _random_ids(rng: np.random.Generator, lengths: np.ndarray) -> Ragged:
    values = rng.integers(4, 32_000, int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    values[ends - 1] = EOS_ID
    return Ragged(values, (ends - lengths).astype(np.int64), lengths.astype(np.int32))


def measure(iterator: BatchIterator, seconds: float) -> dict[str, float]:
    """Pull batches for about `seconds` (at least one epoch's planning); rates per second of wall time."""
    real = slots = batches = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = next(iterator)
        real += int(np.count_nonzero(batch["inputs"])) + int(np.count_nonzero(batch["targets"]))
        slots += batch["inputs"].size + batch["targets"].size
        batches += 1
    elapsed = time.perf_counter() - start
    return {"batches/s": batches / elapsed, "real tok/s": real / elapsed, "slot tok/s": slots / elapsed,
            "efficiency": real / slots, "shapes": len(iterator.shapes())}


def report(name: str, corpus: EncodedPairs, tokens_per_batch: int, max_length: int,
           seconds: float) -> dict[str, dict[str, float]]:
    """Print one line per batching mode; return the measurements by mode."""
    results = {}
    for pack in (True, False):
        iterator = BatchIterator(corpus, tokens_per_batch, max_length, pack=pack, seed=0)
        result = measure(iterator, seconds)
        mode = "packed" if pack else "bucketed"
        print(f"{name:<22} {mode:<9} {len(corpus):>8,} pairs  tokens_per_batch={tokens_per_batch:<6} "
              f"shapes={result['shapes']:<3} efficiency={result['efficiency']:6.1%}  "
              f"{result['batches/s']:8.1f} batches/s  {result['real tok/s'] / 1e6:6.2f} M real tok/s")
        results[mode] = result
    return results


def run(seconds: float, builtin: EncodedPairs) -> dict[str, dict[str, dict[str, float]]]:
    """Both corpora, packed and bucketed."""
    return {"built-in (max_len 64)": report("built-in (max_len 64)", builtin, 4_096, 64, seconds),
            "WMT-like (max_len 256)": report("WMT-like (max_len 256)", wmt_like_corpus(500_000), 25_000, 256, seconds)}
