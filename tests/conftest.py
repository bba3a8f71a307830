"""Shared fixtures: a tiny config and small token batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import TransformerConfig


@pytest.fixture
def tiny_config() -> TransformerConfig:
    """The tiny preset with dropout, small enough for CPU tests."""
    return TransformerConfig.preset("tiny", vocab_size=50, max_len=32)


@pytest.fixture
def token_batch() -> tuple[jax.Array, jax.Array]:
    """Source [2, 6] and shifted-right target [2, 5] ids with padding (0) in the second row."""
    src = jnp.array([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 0, 0]], jnp.int32)
    tgt_in = jnp.array([[2, 13, 14, 15, 16], [2, 17, 18, 0, 0]], jnp.int32)
    return src, tgt_in


def random_tokens(rng: np.random.Generator, shape: tuple[int, ...], vocab: int) -> jax.Array:
    """Non-pad token ids in [4, vocab)."""
    return jnp.asarray(rng.integers(4, vocab, size=shape), jnp.int32)


def tiny_run_config():
    """The demo run shrunk to seconds: a small built-in corpus, a tiny model, a few steps."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "configs" / "demo.py"
    spec = importlib.util.spec_from_file_location("demo_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.data.builtin_train_size = 600
    config.data.builtin_dev_size = 16
    config.data.builtin_test_size = 16
    config.data.vocab_size = 500
    config.data.pack = True
    config.data.tokenizer_sample_size = 1200
    config.data.tokens_per_batch = 512
    config.data.max_length = 64
    config.data.eval_batch_size = 16
    config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2, max_len=128)
    config.training.update(num_train_steps=6, warmup_steps=3, log_every=1, eval_every=3,
                           checkpoint_every=2, keep_checkpoints=2, bleu_every=0)
    config.eval.update(beam_size=2, max_extra_length=4)
    return config


@pytest.fixture
def run_config():
    """A fresh tiny run config (see tiny_run_config)."""
    return tiny_run_config()
