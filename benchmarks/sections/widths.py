"""Packed row width: rows of max_length, the width chosen from the corpus, and length buckets, alternating.

Each mode trains its own copy of the run builder's initial state on its own batches, pipeline-fed as
in training; every shape a mode uses is compiled before timing; the modes alternate within each round
(`--rounds` of `--steps` updates). "Attention wasted" is the share of computed attention scores
(encoder self, decoder self, cross; rows x width^2 each) that fall outside a pair (s^2 + t^2 + s*t) or
on padding. data.max_length = 256 in every mode; "rows of max_length" was the default before the
automatic width (`choose_packed_rows`). Profiles: short sentences (mean ~12 tokens, d_model 256, N=3,
vocabulary 8,000) and WMT-like lengths (mean ~27; the small model with vocabulary 32,000 on CPU, the
base model in bfloat16 on GPU; `--widths_base`: only this profile, with the base model).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

from benchmarks.corpora import wmt_like_corpus
from benchmarks.models import BASE, SHORT_SENTENCES, SMALL, on_gpu, one_device_run
from transformer_jax import TransformerConfig
from transformer_jax.base import global_batch
from transformer_jax.data import BatchIterator, EncodedPairs, choose_packed_rows
from transformer_jax.model import PAD_ID

ROUNDS = 7
MAX_LENGTH = 256
# The batching modes compared, filled in with the corpus's chosen width.
WIDTH_MODES = ("rows of max_length", "automatic width", "length buckets")


def attention_scores(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """(computed, useful) attention scores of one batch, per head and layer, over the encoder self,
    decoder self and cross attention: every row pays width^2 for each; a pair uses s^2 + t^2 + s*t."""
    rows, width = batch["targets"].shape
    useful = 0
    if "targets_segmentation" in batch:
        segments = {name: batch[f"{name}_segmentation"] for name in ("inputs", "targets")}
    else:
        segments = {name: (batch[name] != PAD_ID).astype(np.int32) for name in ("inputs", "targets")}
    count = max(int(segments["inputs"].max()), int(segments["targets"].max())) + 1
    for row in range(rows):
        s = np.bincount(segments["inputs"][row], minlength=count)[1:].astype(np.int64)
        t = np.bincount(segments["targets"][row], minlength=count)[1:].astype(np.int64)
        useful += int((s * s + t * t + s * t).sum())
    return 3 * rows * width * width, useful


def compare_widths(config: TransformerConfig, corpus: EncodedPairs, tokens_per_batch: int, max_length: int,
                   rounds: int, steps: int) -> dict[str, Any]:
    """Real target tokens/s and wasted attention of the three batching modes, timed in alternating rounds."""
    chosen = choose_packed_rows(corpus, config, tokens_per_batch, max_length)
    settings = {"rows of max_length": dict(pack=True, row_width=max_length),
                "automatic width": dict(pack=True, row_width=chosen.width, rows_per_width=chosen.rows),
                "length buckets": dict(pack=False)}
    programs = one_device_run(config)
    contenders = {}
    for mode in WIDTH_MODES:
        iterator = BatchIterator(corpus, tokens_per_batch, max_length, seed=0, **settings[mode])
        state = programs.init_state()
        plan = iterator.plan(0)
        needed, seen = set(zip(plan.batch_rows.tolist(), plan.batch_lengths.tolist())), set()
        warm_up = BatchIterator(corpus, tokens_per_batch, max_length, seed=1, **settings[mode])
        while seen != needed:  # compile every shape the epoch uses (before timing)
            batch = next(warm_up)
            if batch["inputs"].shape not in seen:
                seen.add(batch["inputs"].shape)
                state, metrics = programs.train_step(state, global_batch(batch, programs.mesh))
                jax.block_until_ready(metrics)
        contenders[mode] = {"iterator": iterator, "state": state, "seconds": [], "tokens": [], "scores": [0, 0],
                            "widths": sorted({length for _, length in needed})}
    for _ in range(rounds):
        for c in contenders.values():
            real, start = 0, time.perf_counter()
            for _ in range(steps):
                batch = next(c["iterator"])
                real += int(np.count_nonzero(batch["targets"]))
                computed, useful = attention_scores(batch)
                c["scores"][0] += computed
                c["scores"][1] += useful
                c["state"], metrics = programs.train_step(c["state"], global_batch(batch, programs.mesh))
            jax.block_until_ready(metrics)
            c["seconds"].append(time.perf_counter() - start)
            c["tokens"].append(real)
    result: dict[str, Any] = {"chosen_width": chosen.width, "rounds": rounds, "steps_per_round": steps}
    first = contenders[WIDTH_MODES[0]]
    baseline = [t / s for t, s in zip(first["tokens"], first["seconds"])]
    for mode, c in contenders.items():
        rates = [t / s for t, s in zip(c["tokens"], c["seconds"])]
        result[mode] = {"real_target_tokens_per_s": sum(c["tokens"]) / sum(c["seconds"]),
                        "median_round_tokens_per_s": float(np.median(rates)),
                        "ratio_over_max_length_rows": float(np.median([r / b for r, b in zip(rates, baseline)])),
                        "wasted_attention": 1.0 - c["scores"][1] / c["scores"][0],
                        "widths": c["widths"]}
    return result


def cases(args: argparse.Namespace) -> list[tuple[str, TransformerConfig, EncodedPairs, int]]:
    """(name, model, corpus, tokens per batch) of each profile this machine and these flags time."""
    wmt = wmt_like_corpus(1_000_000 if on_gpu() else 100_000)
    if args.widths_base:  # the paper's base model (vocabulary 37,000) at a CPU-sized batch
        return [("WMT-like (mean 27), base model, 4,096 tokens", BASE, wmt, 4_096)]
    short = ("short sentences (mean 12), d_model 256, N=3, 4,096 tokens", SHORT_SENTENCES,
             wmt_like_corpus(34_000, median=10), 4_096)
    if on_gpu():
        return [short, ("WMT-like (mean 27), base bf16, 25,000 tokens", BASE.replace(dtype="bfloat16"), wmt, 25_000)]
    # The base model's CPU steps take ~10 s each on a shared 2-core machine: the small model.
    return [short, ("WMT-like (mean 27), small model, vocab 32,000, 4,096 tokens", SMALL.replace(vocab_size=32000),
                    wmt, 4_096)]


def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each profile: the three modes, one line each."""
    rounds, steps = (2, 1) if args.quick else (args.rounds or ROUNDS, args.steps)
    rows = {}
    for name, config, corpus, tokens in cases(args):
        result = compare_widths(config, corpus, tokens, MAX_LENGTH, rounds, steps)
        rows[name] = result
        print(f"{name} (max_length {MAX_LENGTH}, chosen row width {result['chosen_width']}):")
        for mode in WIDTH_MODES:
            r = result[mode]
            print(f"  {mode:<20} widths {','.join(map(str, r['widths'])):<28} {r['real_target_tokens_per_s']:>8,.0f} "
                  f"real target tok/s  x{r['ratio_over_max_length_rows']:.2f} (median of rounds)  attention "
                  f"wasted {r['wasted_attention']:.1%}", flush=True)
    return rows
