"""Dropout: keep probability, exact expectation, masks, gradients, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.dropout import (
    DRAW_LEVELS,
    Dropout,
    hashed_words,
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
    # Not the CPU's split 16-bit threefry draws: a different mask from the same key.
    monkeypatch.setattr(dropout, "kernel_platform", lambda: "cpu")
    assert not np.array_equal(np.asarray(_apply(rate, x, seed=7)) != 0, kept)


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
    """How often two masks agree, minus what independent masks with their keep rates would give."""
    pa, pb = a.mean(), b.mean()
    return float((a == b).mean() - (pa * pb + (1 - pa) * (1 - pb)))


def test_hashed_words_are_uniform_bit_by_bit():
    words = np.asarray(hashed_words(jax.random.key(11), (256, 1024)))
    bits = (words[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    # 262,144 words: each bit's mean has a standard error of 1e-3.
    np.testing.assert_allclose(bits.mean(axis=(0, 1)), 0.5, atol=5e-3)
    assert len(np.unique(words)) > 0.99 * words.size
    # Each bit agrees with the same bit of the next word (and of the next row's) half of the time.
    np.testing.assert_allclose((bits[:, :-1] == bits[:, 1:]).mean(axis=(0, 1)), 0.5, atol=5e-3)
    np.testing.assert_allclose((bits[:-1] == bits[1:]).mean(axis=(0, 1)), 0.5, atol=5e-3)
    # The top 4 bits of neighbouring words fall in the 256 cells evenly (chi-square, 255 degrees of freedom:
    # 99.99% of independent draws stay below 360).
    cells = np.bincount(((words[:, :-1] >> 28) * 16 + (words[:, 1:] >> 28)).ravel(), minlength=256)
    expected = cells.sum() / 256
    assert ((cells - expected) ** 2 / expected).sum() < 360


def test_hashed_masks_are_independent_between_neighbours_rows_keys_and_steps():
    threshold = np.uint32(keep_threshold(0.1) * DRAW_LEVELS)
    key = jax.random.key(12)
    mask = np.asarray(hashed_words(key, (512, 2048)) < threshold)
    # Neighbouring features, neighbouring rows, a row and the one 8 further on.
    assert abs(_agreement(mask[:, :-1], mask[:, 1:])) < 3e-3
    assert abs(_agreement(mask[:-1], mask[1:])) < 3e-3
    assert abs(_agreement(mask[:-8], mask[8:])) < 3e-3
    # Another key, and the next step's key (the train step folds the step into the dropout key).
    other = np.asarray(hashed_words(jax.random.key(13), (512, 2048)) < threshold)
    step = np.asarray(hashed_words(jax.random.fold_in(key, 1), (512, 2048)) < threshold)
    assert abs(_agreement(mask, other)) < 3e-3
    assert abs(_agreement(mask, step)) < 3e-3
    assert not np.array_equal(mask, step)


def test_hashed_words_depend_on_the_position_alone():
    """A tensor's words are those of the same positions in a reshaped tensor: no draw depends on the shape's
    split, so the shards of a sharded tensor hash their own global positions."""
    key = jax.random.key(14)
    np.testing.assert_array_equal(np.asarray(hashed_words(key, (4, 6, 32))).reshape(24, 32),
                                  np.asarray(hashed_words(key, (24, 32))))
    np.testing.assert_array_equal(np.asarray(hashed_words(key, (24, 32)))[5:9],
                                  np.asarray(jax.jit(lambda k: hashed_words(k, (24, 32))[5:9])(key)))
    assert hashed_words(key, ()).shape == ()
