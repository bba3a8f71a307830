"""Input-pipeline throughput: tokens/s produced by BatchIterator, and its padding efficiency.

Two corpora: the built-in synthetic corpus (tokenized as a run does, vocabulary 4,000, max_length 64)
and a WMT-like length distribution (lognormal, mean about 27 tokens, at most 256, 500,000 pairs). For
each, packed and bucketed batches are pulled for a few seconds, epoch planning included. "real tok/s"
counts non-padding tokens of inputs + targets, the figure to compare with what a train step consumes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.corpora import builtin_encoded, wmt_like_corpus
from transformer_jax.data import BatchIterator, EncodedPairs


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
              f"{result['batches/s']:8.1f} batches/s  {result['real tok/s'] / 1e6:6.2f} M real tok/s", flush=True)
        results[mode] = result
    return results


def run(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    """Both corpora, packed and bucketed."""
    seconds = 1.0 if args.quick else 5.0
    return {"built-in (max_len 64)": report("built-in (max_len 64)", builtin_encoded(), 4_096, 64, seconds),
            "WMT-like (max_len 256)": report("WMT-like (max_len 256)", wmt_like_corpus(500_000), 25_000, 256, seconds)}
