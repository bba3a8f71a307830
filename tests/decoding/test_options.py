"""DecodeOptions: the paper's defaults, one ConfigError naming the field per bad value, `replace`, `override`
(a setting of another mode refused, as a keyword or a flag) and `settings`."""

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
    # integers beyond what decoding adds to int32 lengths and indices
    ("max_extra_length", 2**31), ("max_extra_length", 2**30 + 1), ("beam_size", 2**31), ("top_k", 2**31), ("top_k", True),
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
    assert TranslationBatching(2**30, 2**30).batch_size == 2**30  # the largest of each
    for field, value in (("batch_size", 0), ("batch_tokens", -1), ("batch_size", True), ("batch_size", 2**31),
                         ("batch_tokens", 2**30 + 1)):
        with pytest.raises(ConfigError, match=field):
            TranslationBatching(**{field: value})


def test_the_largest_integers_are_named_with_their_range():
    assert DecodeOptions(max_extra_length=2**30, beam_size=2**30, top_k=2**30).max_extra_length == 2**30
    with pytest.raises(ConfigError) as refused:
        DecodeOptions(max_extra_length=2147483648)
    assert str(refused.value) == "max_extra_length=2147483648 must be a positive integer, at most 2**30 = 1073741824"


@pytest.mark.parametrize("settings, refused", [
    ({"top_k": 5}, "top_k applies to mode='sample', not mode='beam'; drop it, or pass mode='sample'"),
    ({"mode": "greedy", "beam_size": 8}, "beam_size applies to mode='beam', not mode='greedy'"),
    ({"mode": "beam", "temperature": 0.5}, "temperature applies to mode='sample', not mode='beam'"),
    ({"mode": "sample", "alpha": 0.8}, "alpha applies to mode='beam', not mode='sample'"),
])
def test_a_setting_of_another_mode_is_refused_not_ignored(settings, refused):
    with pytest.raises(ConfigError) as error:
        DecodeOptions().override(settings)
    assert str(error.value).startswith(refused) and "\n" not in str(error.value)


def test_override_applies_what_was_given_and_spells_flags_for_the_command_line():
    options = DecodeOptions(beam_size=6).override({"mode": "sample", "top_k": 3, "beam_size": None, "seed": None})
    assert (options.mode, options.top_k, options.beam_size, options.seed) == ("sample", 3, 6, 0)
    assert DecodeOptions().override({"max_extra_length": 7}).max_extra_length == 7  # every mode's limit
    with pytest.raises(ConfigError) as error:
        DecodeOptions().override({"mode": "greedy", "top_p": 0.9}, as_flags=True)
    assert str(error.value) == ("--top_p applies to --mode=sample, not --mode=greedy; drop it, or pass "
                                "--mode=sample")


@pytest.mark.parametrize("mode", ["beam", "greedy", "sample"])
def test_settings_hold_the_fields_of_the_mode_and_override_takes_them_back(mode):
    options = DecodeOptions(mode=mode)
    settings = options.settings()
    assert settings["mode"] == mode and "max_extra_length" in settings
    assert ("beam_size" in settings) == (mode == "beam") and ("top_k" in settings) == (mode == "sample")
    assert DecodeOptions().override(settings) == options
