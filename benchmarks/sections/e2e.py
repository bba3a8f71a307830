"""End-to-end training throughput: the input pipeline, padding and the train step together.

Batches come from `BatchIterator` (packed rows of max_length) and are placed on the device every step,
as `Trainer.update` does, into the run builder's train step; the figure counts real (non-padding)
target tokens per second. The bare step on one fixed batch of the same shape is timed in the same
run, so the difference is what the pipeline and padding cost. CPU: the small model on the built-in
corpus and on WMT-like lengths (vocabulary 32,000); GPU: the base model in bfloat16 at 25,000 tokens.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

from benchmarks.corpora import builtin_encoded, wmt_like_corpus
from benchmarks.models import BASE, SMALL, on_gpu, one_device_run
from transformer_jax import TransformerConfig
from transformer_jax.base import global_batch
from transformer_jax.data import BatchIterator, EncodedPairs


def measure(config: TransformerConfig, corpus: EncodedPairs, tokens_per_batch: int, max_length: int,
            steps: int) -> dict[str, Any]:
    """Real target tokens/s over `steps` pipeline-fed updates, and the bare step on a fixed batch."""
    programs = one_device_run(config)
    state = programs.init_state()
    iterator = BatchIterator(corpus, tokens_per_batch, max_length, pack=True, seed=0)
    fixed = global_batch(next(iterator), programs.mesh)
    state, metrics = programs.train_step(state, fixed)  # compile (packed batches all have one shape)
    jax.block_until_ready(metrics)

    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = programs.train_step(state, fixed)
    jax.block_until_ready(metrics)
    bare_s = (time.perf_counter() - start) / steps

    real = slots = 0
    start = time.perf_counter()
    for _ in range(steps):
        batch = next(iterator)
        real += int(np.count_nonzero(batch["targets"]))
        slots += batch["targets"].size
        state, metrics = programs.train_step(state, global_batch(batch, programs.mesh))
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - start
    return {"steps": steps, "tokens_per_batch": tokens_per_batch, "max_length": max_length,
            "real_target_tokens_per_s": real / seconds, "target_slots_per_s": slots / seconds,
            "padding_efficiency": real / slots, "s_per_step": seconds / steps, "bare_s_per_step": bare_s,
            "pipeline_overhead": seconds / steps / bare_s - 1.0}


def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Both corpora, one line each."""
    steps = 3 if args.quick else 10
    builtin = builtin_encoded()
    wmt = wmt_like_corpus(1_000_000 if on_gpu() else 100_000)
    if on_gpu():
        cases = [("built-in corpus, base bf16", BASE.replace(vocab_size=4000, dtype="bfloat16"), builtin, 25_000, 64),
                 ("WMT-like lengths, base bf16", BASE.replace(vocab_size=32000, dtype="bfloat16"), wmt, 25_000, 256)]
    else:
        cases = [("built-in corpus, small model", SMALL, builtin, 4_096, 64),
                 ("WMT-like lengths, small model, vocab 32,000", SMALL.replace(vocab_size=32000), wmt, 8_192, 256)]
    rows = {}
    for name, config, corpus, tokens, max_length in cases:
        result = measure(config, corpus, tokens, max_length, steps)
        rows[name] = result
        print(f"{name:<48} {result['real_target_tokens_per_s']:>9,.0f} real target tok/s  padding efficiency "
              f"{result['padding_efficiency']:.1%}  step {result['s_per_step']:.3f}s (bare "
              f"{result['bare_s_per_step']:.3f}s, pipeline + padding {result['pipeline_overhead']:+.1%})", flush=True)
    return rows
