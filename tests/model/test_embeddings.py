"""Positional encodings and the scaled token embedding."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.embeddings import TokenEmbedding
from transformer_jax.model.positional_encoding import (
    PositionalEncoding,
    sinusoidal_encoding,
)


def test_sinusoid_matches_worked_example():
    # pos=4, d_model=6: (sin 4, cos 4, sin 4/10000^(2/6), cos ..., sin 4/10000^(4/6), cos ...).
    # The reference figures are quoted to 4 decimals (some truncated rather than rounded), so the
    # tolerance is one unit in the last quoted place.
    pe = sinusoidal_encoding(jnp.array([4]), 6)[0]
    expected = [-0.7568, -0.6536, 0.1845, 0.9827, 0.0086, 1.0000]
    np.testing.assert_allclose(pe, expected, rtol=0, atol=1.2e-4)
    np.testing.assert_allclose(pe, [np.sin(4), np.cos(4), np.sin(4 / 10000 ** (2 / 6)),
                                    np.cos(4 / 10000 ** (2 / 6)), np.sin(4 / 10000 ** (4 / 6)),
                                    np.cos(4 / 10000 ** (4 / 6))], rtol=1e-6)


def test_sinusoid_matches_formula_everywhere():
    d_model, positions = 16, np.arange(50)
    pe = np.asarray(sinusoidal_encoding(jnp.asarray(positions), d_model))
    for i in range(d_model // 2):
        angle = positions / 10000 ** (2 * i / d_model)
        np.testing.assert_allclose(pe[:, 2 * i], np.sin(angle), atol=1e-5)
        np.testing.assert_allclose(pe[:, 2 * i + 1], np.cos(angle), atol=1e-5)


def test_explicit_positions_restart_for_packed_rows():
    module = PositionalEncoding(d_model=8, max_len=16)
    packed = module.apply({}, jnp.array([[0, 1, 2, 0, 1]]))
    np.testing.assert_array_equal(packed[0, 3:], packed[0, :2])


def test_learned_positions_have_a_table_and_differ_per_position():
    module = PositionalEncoding(d_model=8, max_len=16, kind="learned")
    variables = module.init(jax.random.key(0), jnp.array([[0, 1]]))
    assert variables["params"]["position_embedding"].value.shape == (16, 8)
    out = module.apply(variables, jnp.array([[0, 1, 0]]))
    np.testing.assert_array_equal(out[0, 0], out[0, 2])
    assert not np.allclose(out[0, 0], out[0, 1])


def test_embedding_is_scaled_by_sqrt_d_model_and_attend_uses_same_table():
    module = TokenEmbedding(vocab_size=10, d_model=16)
    variables = module.init(jax.random.key(0), jnp.array([[1]]))
    table = variables["params"]["embedding"].value
    np.testing.assert_allclose(module.apply(variables, jnp.array([[3]]))[0, 0], table[3] * 4.0, rtol=1e-6)
    x = jnp.ones((1, 1, 16))
    logits = module.apply(variables, x, method=TokenEmbedding.attend)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits[0, 0], table.sum(-1), rtol=1e-5)


def test_untied_output_projection_gives_float32_logits_from_bfloat16_inputs():
    from transformer_jax.model.embeddings import OutputProjection

    module = OutputProjection(vocab_size=7, dtype=jnp.bfloat16)
    x = jnp.ones((1, 2, 4), jnp.bfloat16)
    variables = module.init(jax.random.key(0), x)
    logits = module.apply(variables, x)
    assert logits.dtype == jnp.float32 and logits.shape == (1, 2, 7)
    kernel = variables["params"]["kernel"].value
    np.testing.assert_allclose(logits[0, 0], np.asarray(kernel, np.float32).sum(0), rtol=1e-2)
