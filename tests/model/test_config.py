"""TransformerConfig presets and validation."""

import jax.numpy as jnp
import pytest

from transformer_jax import ConfigError, TransformerConfig


def test_presets_follow_the_paper():
    base, big = TransformerConfig.preset("base"), TransformerConfig.preset("big")
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.dropout_rate) == (6, 512, 2048, 8, 0.1)
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.dropout_rate) == (6, 1024, 4096, 16, 0.3)
    assert base.head_dim == 64 and big.head_dim == 64
    assert base.norm_position == "post" and base.share_embeddings and base.tie_output_embedding


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"d_model": 100, "num_heads": 8}, "not divisible by num_heads"),
        ({"num_layers": 0}, "num_layers=0 must be a positive integer"),
        ({"d_ff": -4}, "d_ff=-4 must be a positive integer"),
        ({"dropout_rate": 1.0}, "dropout_rate=1.0 must be in [0, 1)"),
        ({"dropout_rate": -0.1}, "must be in [0, 1)"),
        ({"dtype": "float64"}, "dtype='float64' is not one of"),
        ({"norm_position": "middle"}, "norm_position='middle'"),
        ({"attention_backend": "fused", "attention_dropout_rate": 0.1}, "cannot apply attention dropout"),
        ({"num_hedas": 8}, "unknown TransformerConfig key(s) ['num_hedas']"),
    ],
)
def test_invalid_values_raise_one_clear_line(changes, message):
    with pytest.raises(ConfigError) as error:
        TransformerConfig().replace(**changes)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match="choose one of"):
        TransformerConfig.preset("huge")


def test_compute_and_parameter_dtypes_are_separate():
    config = TransformerConfig(dtype="bfloat16")
    assert jnp.dtype(config.compute_dtype) == jnp.bfloat16
    assert jnp.dtype(config.params_dtype) == jnp.float32
