"""Masks: shapes, padding, causality, segments, combination."""

import jax.numpy as jnp
import numpy as np

from transformer_jax.model.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)


def test_padding_mask_marks_pad_queries_and_keys():
    q = jnp.array([[4, 5, 0]])
    kv = jnp.array([[6, 0, 0, 7]])
    mask = padding_mask(q, kv)
    assert mask.shape == (1, 1, 3, 4)
    expected = np.array([[1, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(mask[0, 0], expected)


def test_causal_mask_is_lower_triangular():
    mask = causal_mask(4)
    assert mask.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((4, 4), bool)))


def test_segment_mask_blocks_other_segments():
    segments = jnp.array([[1, 1, 2, 2, 0]])
    mask = segment_mask(segments, segments)[0, 0]
    assert bool(mask[0, 1]) and bool(mask[2, 3])
    assert not bool(mask[0, 2]) and not bool(mask[3, 1])


def test_combine_masks_is_logical_and_and_skips_none():
    a = jnp.array([[[[True, True], [False, True]]]])
    b = jnp.array([[[[True, False], [True, True]]]])
    np.testing.assert_array_equal(combine_masks(a, None, b), a & b)
    assert combine_masks(None, None) is None
