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
