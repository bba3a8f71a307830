"""DecodeOptions: the paper's defaults, one ConfigError naming the field per bad value, `replace`."""

from __future__ import annotations

import pytest

from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import ConfigError


def test_defaults_are_the_papers():
    options = DecodeOptions()
    assert (options.mode, options.beam_size, options.alpha, options.max_extra_length) == ("beam", 4, 0.6, 50)
    assert options.describe() == "beam search (beam 4, alpha 0.6)"


@pytest.mark.parametrize("field, value", [
    ("temperature", 0.0), ("temperature", -1.0), ("temperature", float("inf")), ("top_p", 0.0), ("top_p", 1.5), ("beam_size", 0),
    ("mode", "nucleus"), ("top_k", -1), ("alpha", -0.1), ("max_extra_length", 0),
    # numbers that are 0 or inf once in float32, where decoding computes; seeds JAX cannot take
    ("temperature", 1e-50), ("temperature", 1e-44), ("temperature", 1e300), ("top_p", 1e-50), ("alpha", 1e39), ("seed", -1), ("seed", 2**63),
])
def test_a_bad_value_raises_a_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        DecodeOptions(**{field: value})


def test_replace_ignores_none_and_validates_again():
    options = DecodeOptions(mode="sample", temperature=0.7)
    changed = options.replace(temperature=None, top_p=0.9, beam_size=None)
    assert (changed.mode, changed.temperature, changed.top_p, changed.beam_size) == ("sample", 0.7, 0.9, 4)
    assert options.top_p == 1.0  # a copy: the original is unchanged
    with pytest.raises(ConfigError, match="top_p"):
        options.replace(top_p=2.0)
    with pytest.raises(ConfigError, match="unknown"):
        options.replace(beams=8)


def test_search_settings_are_apart_from_batching_and_precision():
    """DecodeOptions says what to search for; how a split is batched and the dtype are other objects."""
    from transformer_jax.data.shapes import TranslationBatching

    fields = set(DecodeOptions.__dataclass_fields__)
    assert fields == {"mode", "beam_size", "alpha", "max_extra_length", "temperature", "top_k", "top_p", "seed"}
    assert TranslationBatching() == TranslationBatching(batch_size=64, batch_tokens=0)
    assert TranslationBatching(8).replace(batch_tokens=None, batch_size=4) == TranslationBatching(4, 0)
    for field, value in (("batch_size", 0), ("batch_tokens", -1), ("batch_size", True)):
        with pytest.raises(ConfigError, match=field):
            TranslationBatching(**{field: value})
