"""Top-k by vocabulary blocks: the same values and indices as jax.lax.top_k."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decoding.top_k import top_k_in_blocks


@pytest.mark.parametrize("vocab, block", [(8000, 64), (1003, 64), (300, 32), (40, 64)])
def test_top_k_in_blocks_equals_lax_top_k_ties_and_minus_inf_included(vocab, block):
    rng = np.random.default_rng(vocab)
    # Values on a coarse grid, so many are tied; some rows mostly -inf (PAD/BOS are -inf in a step).
    x_RxV = np.round(rng.normal(size=(16, vocab)) * 2) / 2
    x_RxV[:4, : vocab - 3] = -np.inf
    x_RxV[4, :] = 0.0
    x_RxV = jnp.asarray(x_RxV, jnp.float32)
    for k in (1, 8):
        values, indices = top_k_in_blocks(x_RxV, k, block)
        expected_values, expected_indices = jax.lax.top_k(x_RxV, k)
        np.testing.assert_array_equal(indices, expected_indices)
        np.testing.assert_array_equal(values, expected_values)
