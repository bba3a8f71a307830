"""Dropout: keep probability, exact expectation, masks, gradients, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.dropout import (
    DRAW_LEVELS,
    Dropout,
    keep_mask,
    keep_threshold,
)


def _apply(rate: float, x: jax.Array, seed: int = 0, deterministic: bool = False) -> jax.Array:
    return Dropout(rate).apply({}, x, deterministic=deterministic, rngs={"dropout": jax.random.key(seed)})


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_kept_fraction_matches_the_rate(rate):
    x = jnp.ones((64, 128, 257))  # an odd last dimension: one high half is cut off
    kept = float((_apply(rate, x) != 0).mean())
    # 2.1M draws: the standard error of the fraction is below 3.5e-4.
    assert abs(kept - (1 - rate)) < 2e-3


def test_kept_values_are_divided_by_the_exact_keep_probability():
    rate = 0.1
    x = jax.random.normal(jax.random.key(1), (32, 64, 512))
    y = np.asarray(_apply(rate, x))
    kept = y != 0
    probability = keep_threshold(rate) / DRAW_LEVELS
    np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / np.float32(probability), rtol=1e-6)
    assert abs(probability - (1 - rate)) <= 0.5 / DRAW_LEVELS
    # The expectation is exact: the mean over many masks of the same input approaches the input.
    ones = jnp.ones((4, 8, 512))
    mean = np.mean([np.asarray(_apply(rate, ones, seed)) for seed in range(200)], axis=0)
    assert abs(mean.mean() - 1.0) < 2e-3


def test_low_and_high_halves_of_a_word_drop_independently():
    """The first and second halves of the features use the two halves of the same random words."""
    mask = np.asarray(keep_mask(jax.random.key(3), (4096, 64), keep_threshold(0.5)))
    low, high = mask[:, :32], mask[:, 32:]
    both = (low & high).mean()
    assert abs(both - low.mean() * high.mean()) < 5e-3


def test_gradient_is_the_scaled_mask():
    rate = 0.2
    x = jax.random.normal(jax.random.key(2), (8, 16, 64))
    y, vjp = jax.vjp(lambda v: _apply(rate, v, seed=5), x)
    (grad,) = vjp(jnp.ones_like(y))
    expected = np.where(np.asarray(y) != 0, DRAW_LEVELS / keep_threshold(rate), 0.0)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-6)


def test_deterministic_and_rate_zero_are_the_identity_and_seeds_differ():
    x = jax.random.normal(jax.random.key(4), (4, 8, 32))
    np.testing.assert_array_equal(_apply(0.1, x, deterministic=True), x)
    np.testing.assert_array_equal(_apply(0.0, x), x)
    np.testing.assert_array_equal(_apply(1.0, x), np.zeros_like(x))
    np.testing.assert_array_equal(_apply(0.1, x, seed=7), _apply(0.1, x, seed=7))
    assert not np.array_equal(_apply(0.1, x, seed=7), _apply(0.1, x, seed=8))


def test_dtype_is_preserved():
    x = jnp.ones((4, 8, 32), jnp.bfloat16)
    assert _apply(0.1, x).dtype == jnp.bfloat16


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_the_accelerator_draws_keep_the_same_probability_and_the_gradient_follows_the_mask(rate, monkeypatch):
    """On TPUs and GPUs each element draws one 32-bit word and the mask is not stored for the backward pass."""
    import transformer_jax.model.dropout as dropout

    monkeypatch.setattr(dropout, "kernel_platform", lambda: "tpu")
    x = jax.random.normal(jax.random.key(6), (64, 128, 257))
    y, vjp = jax.vjp(jax.jit(lambda v: _apply(rate, v, seed=7)), x)
    (grad,) = vjp(jnp.ones_like(y))
    kept = np.asarray(y) != 0
    assert abs(kept.mean() - keep_threshold(rate) / DRAW_LEVELS) < 2e-3
    np.testing.assert_allclose(np.asarray(y)[kept], np.asarray(x)[kept] * DRAW_LEVELS / keep_threshold(rate),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.where(kept, DRAW_LEVELS / keep_threshold(rate), 0.0), rtol=1e-6)
    # Not the CPU's split 16-bit draws: a different mask from the same key.
    monkeypatch.setattr(dropout, "kernel_platform", lambda: "cpu")
    assert not np.array_equal(np.asarray(_apply(rate, x, seed=7)) != 0, kept)
