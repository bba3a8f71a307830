"""Greedy decoding and sampling: logit filtering, sampled frequencies, the key deciding the sample."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.decoding.sampling import (
    filter_logits,
    sample_decode,
    sampling_choice,
)


def test_filter_logits_temperature_top_k_and_top_p():
    probs = jnp.array([[0.05, 0.5, 0.15, 0.3]])
    log_probs = jnp.log(probs)
    tempered = jax.nn.softmax(filter_logits(log_probs, 0.5))
    np.testing.assert_allclose(tempered, probs**2 / jnp.sum(probs**2), rtol=1e-5)
    assert np.isfinite(filter_logits(log_probs, 1.0, top_k=2)).tolist() == [[False, True, False, True]]
    # The nucleus is the fewest most probable tokens whose mass reaches top_p.
    assert np.isfinite(filter_logits(log_probs, 1.0, top_p=0.75)).tolist() == [[False, True, False, True]]
    assert np.isfinite(filter_logits(log_probs, 1.0, top_p=0.5)).tolist() == [[False, True, False, False]]
    assert np.isfinite(filter_logits(log_probs, 1.0, top_p=0.85)).tolist() == [[False, True, True, True]]
    np.testing.assert_allclose(filter_logits(log_probs, 1.0, top_p=1.0), log_probs - jnp.log(0.5), rtol=1e-6)


def test_any_temperature_float32_holds_gives_a_distribution():
    """The best token is at 0 before dividing: the smallest temperature is greedy, the largest uniform, no NaN."""
    log_probs = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))
    coldest = jax.nn.softmax(filter_logits(log_probs, 1.2e-38))
    np.testing.assert_array_equal(coldest, [[0.0, 1.0, 0.0, 0.0]])
    hottest = jax.nn.softmax(filter_logits(log_probs, 3e38))
    np.testing.assert_allclose(hottest, [[0.25] * 4])


@functools.partial(jax.jit, static_argnames="top_k")
def draw(log_probs, key, temperature=1.0, top_k=0, top_p=1.0):
    return sampling_choice(temperature, top_k, top_p)(log_probs, key)


def test_sampled_tokens_follow_the_filtered_distribution():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    log_probs = jnp.log(jnp.tile(jnp.asarray(probs, jnp.float32), (4000, 1)))

    def frequencies(**settings):
        return np.bincount(draw(log_probs, jax.random.key(0), **settings), minlength=4) / 4000

    np.testing.assert_allclose(frequencies(), probs, atol=0.03)
    np.testing.assert_allclose(frequencies(temperature=0.5), probs**2 / np.sum(probs**2), atol=0.03)
    np.testing.assert_allclose(frequencies(top_k=2), [0.625, 0.375, 0, 0], atol=0.03)
    np.testing.assert_allclose(frequencies(top_p=0.7), [0.625, 0.375, 0, 0], atol=0.03)


def test_sampling_from_a_tiny_nucleus_is_greedy_and_the_key_decides_the_sample(model, greedy_output):
    params, config, src = model
    nucleus = sample_decode(params, config, src, jax.random.key(0), top_p=1e-6, max_extra_length=6)
    np.testing.assert_array_equal(nucleus, greedy_output)
    hot = [np.asarray(sample_decode(params, config, src, jax.random.key(k), temperature=5.0,
                                    max_extra_length=6)) for k in (1, 1, 2)]
    np.testing.assert_array_equal(hot[0], hot[1])
    assert not np.array_equal(hot[0], hot[2])


def test_a_row_samples_by_its_id_not_its_place_in_the_batch(model):
    """What lets sampling split a batch over devices, or re-batch a corpus, and draw the same tokens."""
    params, config, src = model
    key = jax.random.key(3)
    ids = np.arange(src.shape[0]) + 100
    whole = np.asarray(sample_decode(params, config, src, key, temperature=5.0, max_extra_length=6, row_ids=ids))
    order = np.arange(src.shape[0])[::-1]
    flipped = np.asarray(sample_decode(params, config, src[order], key, temperature=5.0, max_extra_length=6,
                                       row_ids=ids[order]))
    assert (flipped == whole[order]).all()
    alone = np.asarray(sample_decode(params, config, src[-1:], key, temperature=5.0, max_extra_length=6,
                                     row_ids=ids[-1:]))
    assert (alone[0] == whole[-1]).all()
    # Without ids a row's place is its id: the flipped batch draws other tokens
    by_place = np.asarray(sample_decode(params, config, src[order], key, temperature=5.0, max_extra_length=6))
    assert not (by_place == whole[order]).all()
