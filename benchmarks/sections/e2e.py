"""End-to-end training throughput: the input pipeline, padding and the train step together.

Batches come from `BatchIterator` (packed rows, as training uses them) and go to the device every
step, exactly as `Trainer.update` does; the figure counts real (non-padding) target tokens per
second. The bare step on one fixed batch of the same shape is timed in the same run, so the
difference is what the pipeline and padding cost.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import jax
import numpy as np

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.builtin.corpus import builtin_corpus
from transformer_jax.data.encoded import EncodedPairs, encode_pairs, filter_by_length
from transformer_jax.data.row_width import choose_packed_rows
from transformer_jax.data.tokenizer import load_or_train_tokenizer
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import create_train_state
from transformer_jax.training.step import train_step


def builtin_encoded(vocab_size: int = 4_000, max_length: int = 64) -> EncodedPairs:
    """The built-in training split, tokenized with a SentencePiece model trained on it."""
    splits = builtin_corpus()
    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = load_or_train_tokenizer(workdir, splits["train"], vocab_size=vocab_size, sample_size=20_000)
        corpus, _ = filter_by_length(encode_pairs(splits["train"], tokenizer), max_length)
    return corpus


def measure(config: TransformerConfig, corpus: EncodedPairs, tokens_per_batch: int, max_length: int,
            steps: int) -> dict[str, Any]:
    """Real target tokens/s over `steps` pipeline-fed updates, and the bare step on a fixed batch."""
    model = Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model))
    state = jax.jit(lambda: create_train_state(model, optimizer, seed=0))()
    step_fn = jax.jit(train_step, static_argnums=2, donate_argnums=0)
    iterator = BatchIterator(corpus, tokens_per_batch, max_length, pack=True, seed=0)
    fixed = jax.device_put(next(iterator))
    state, metrics = step_fn(state, fixed, 0.1)  # compile (packed batches all have one shape)
    jax.block_until_ready(metrics)

    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step_fn(state, fixed, 0.1)
    jax.block_until_ready(metrics)
    bare_s = (time.perf_counter() - start) / steps

    real = slots = 0
    start = time.perf_counter()
    for _ in range(steps):
        batch = next(iterator)
        real += int(np.count_nonzero(batch["targets"]))
        slots += batch["targets"].size
        state, metrics = step_fn(state, jax.device_put(batch), 0.1)
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - start
    return {"steps": steps, "tokens_per_batch": tokens_per_batch, "max_length": max_length,
            "real_target_tokens_per_s": real / seconds, "target_slots_per_s": slots / seconds,
            "padding_efficiency": real / slots, "s_per_step": seconds / steps, "bare_s_per_step": bare_s,
            "pipeline_overhead": seconds / steps / bare_s - 1.0}


# The batching modes compared by `compare_widths`: iterator settings, filled in with the corpus's width.
WIDTH_MODES = ("rows of max_length", "automatic width", "length buckets")


def attention_scores(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """(computed, useful) attention scores of one batch, per head and layer, over the encoder self,
    decoder self and cross attention: every row pays width^2 for each; a pair uses s^2 + t^2 + s*t."""
    rows, width = batch["targets"].shape
    useful = 0
    if "targets_segmentation" in batch:
        segments = {name: batch[f"{name}_segmentation"] for name in ("inputs", "targets")}
    else:
        segments = {name: (batch[name] != 0).astype(np.int32) for name in ("inputs", "targets")}
    count = max(int(segments["inputs"].max()), int(segments["targets"].max())) + 1
    for row in range(rows):
        s = np.bincount(segments["inputs"][row], minlength=count)[1:].astype(np.int64)
        t = np.bincount(segments["targets"][row], minlength=count)[1:].astype(np.int64)
        useful += int((s * s + t * t + s * t).sum())
    return 3 * rows * width * width, useful


def compare_widths(config: TransformerConfig, corpus: EncodedPairs, tokens_per_batch: int, max_length: int,
                   rounds: int, steps: int) -> dict[str, Any]:
    """Real target tokens/s and wasted attention of the three batching modes, timed in alternating rounds.

    Each mode trains its own copy of the same initial state on its own batches; every shape a mode can
    produce is compiled before timing. Per round, each mode runs `steps` pipeline-fed updates.
    """
    chosen = choose_packed_rows(corpus, config, tokens_per_batch, max_length)
    width = chosen.width
    settings = {"rows of max_length": dict(pack=True, row_width=max_length),
                "automatic width": dict(pack=True, row_width=width, rows_per_width=chosen.rows),
                "length buckets": dict(pack=False)}
    model = Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model))
    step_fn = jax.jit(train_step, static_argnums=2, donate_argnums=0)
    contenders = {}
    for mode in WIDTH_MODES:
        iterator = BatchIterator(corpus, tokens_per_batch, max_length, seed=0, **settings[mode])
        state = jax.jit(lambda: create_train_state(model, optimizer, seed=0))()
        plan = iterator.plan(0)
        needed, seen = set(zip(plan.batch_rows.tolist(), plan.batch_lengths.tolist())), set()
        warm_up = BatchIterator(corpus, tokens_per_batch, max_length, seed=1, **settings[mode])
        while seen != needed:  # compile every shape the epoch uses (before timing)
            batch = next(warm_up)
            if batch["inputs"].shape not in seen:
                seen.add(batch["inputs"].shape)
                state, metrics = step_fn(state, jax.device_put(batch), 0.1)
                jax.block_until_ready(metrics)
        contenders[mode] = {"iterator": iterator, "state": state, "seconds": [], "tokens": [], "scores": [0, 0],
                            "widths": sorted({length for _, length in needed})}
    for _ in range(rounds):
        for mode, c in contenders.items():
            real, start = 0, time.perf_counter()
            for _ in range(steps):
                batch = next(c["iterator"])
                real += int(np.count_nonzero(batch["targets"]))
                computed, useful = attention_scores(batch)
                c["scores"][0] += computed
                c["scores"][1] += useful
                c["state"], metrics = step_fn(c["state"], jax.device_put(batch), 0.1)
            jax.block_until_ready(metrics)
            c["seconds"].append(time.perf_counter() - start)
            c["tokens"].append(real)
    result = {"chosen_width": width, "rounds": rounds, "steps_per_round": steps}
    baseline = [t / s for t, s in zip(contenders[WIDTH_MODES[0]]["tokens"], contenders[WIDTH_MODES[0]]["seconds"])]
    for mode, c in contenders.items():
        rates = [t / s for t, s in zip(c["tokens"], c["seconds"])]
        result[mode] = {"real_target_tokens_per_s": sum(c["tokens"]) / sum(c["seconds"]),
                        "median_round_tokens_per_s": float(np.median(rates)),
                        "ratio_over_max_length_rows": float(np.median([r / b for r, b in zip(rates, baseline)])),
                        "wasted_attention": 1.0 - c["scores"][1] / c["scores"][0],
                        "widths": c["widths"]}
    return result
