"""Device-sized translation batches: the search's memory per sentence, and batches that keep within it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.data.shapes import (
    MAX_SEARCH_SENTENCES_PER_DEVICE,
    SEARCH_MEMORY_SHARE,
    TRANSLATION_BUCKETS,
    device_translation_batching,
    search_bytes_per_sentence,
    translation_rows,
)
from transformer_jax.decoding.beam_search import _beam_search
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer

BASE = TransformerConfig(vocab_size=37000, dtype="bfloat16")


def compiled_bytes(config: TransformerConfig, rows: int, width: int) -> int:
    """What XLA's memory analysis gives the beam search (beam 4, +50) of `rows` sources of `width` tokens."""
    params = jax.eval_shape(lambda: Transformer(config).init(
        jax.random.key(0), jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32))["params"])
    source = jax.ShapeDtypeStruct((rows, width), jnp.int32)
    memory = _beam_search.lower(params, config, source, jnp.float32(0.6), beam_size=4, max_extra_length=50,
                                num_returned=1, use_cache=True, eos_id=3).compile().memory_analysis()
    return memory.temp_size_in_bytes + memory.output_size_in_bytes + memory.argument_size_in_bytes


@pytest.mark.parametrize("width", [32, 128])
def test_the_estimate_per_sentence_covers_what_the_compiled_search_holds(width):
    # On a CPU the caches are float32 (4 bytes), as decoding_precision makes them there. At 128 tokens the tiny
    # model's encoder scores (heads x width x width) outweigh its caches: an estimate without them falls short.
    config = TransformerConfig.preset("tiny", float32_dot_outputs=True)
    per_sentence = (compiled_bytes(config, 24, width) - compiled_bytes(config, 8, width)) / 16
    estimate = search_bytes_per_sentence(config, 4, width, 50, 4)
    assert per_sentence <= estimate <= 2 * per_sentence


# A small model of long sources (its encoder scores weigh most at the widest widths) beside the base model.
SMALL_LONG = TransformerConfig(vocab_size=1000, num_layers=1, d_model=64, d_ff=128, num_heads=4, max_len=256)


@pytest.mark.parametrize("mode", ["beam", "greedy"])
@pytest.mark.parametrize("model,free_gb,devices", [(BASE, 3, 1), (BASE, 20, 1), (BASE, 100, 8), (SMALL_LONG, 0.05, 1)],
                         ids=["base-3GB", "base-20GB", "base-100GBx8", "small-long-50MB"])
def test_every_translation_width_keeps_within_the_memory_share(model, mode, free_gb, devices):
    options = DecodeOptions(mode=mode)
    batching = device_translation_batching(model, options, int(free_gb * 1e9), devices, cache_bytes=2)
    hypotheses = 4 if mode == "beam" else 1
    for width in TRANSLATION_BUCKETS:
        rows = translation_rows(width, batching.batch_size, batching.batch_tokens, devices)
        per_device = rows // devices * search_bytes_per_sentence(model, hypotheses, width, 50, 2)
        assert per_device <= SEARCH_MEMORY_SHARE * free_gb * 1e9, width
    assert batching.batch_size % devices == 0
    assert batching.batch_size // devices <= MAX_SEARCH_SENTENCES_PER_DEVICE


def test_more_memory_gives_more_rows_up_to_the_cap_and_greedy_more_than_beam():
    small, large = (device_translation_batching(BASE, DecodeOptions(), int(gb * 1e9), 1, 2) for gb in (2, 8))
    assert small.batch_size < large.batch_size
    greedy = device_translation_batching(BASE, DecodeOptions(mode="greedy"), int(2e9), 1, 2)
    assert greedy.batch_size > small.batch_size
    huge = device_translation_batching(BASE, DecodeOptions(), int(140e9), 1, 2)
    assert huge.batch_size == MAX_SEARCH_SENTENCES_PER_DEVICE
