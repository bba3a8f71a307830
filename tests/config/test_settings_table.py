"""The whole table of declared limits: for every run setting with a bound or choices, a value just outside is refused
by the start-up check the commands use (check_run_config) in one line naming the key and its `--config.` flag, and a
value just inside (each choice) is accepted; TransformerConfig and DecodeOptions, used from Python without a run
config, refuse and accept the same values by the same declaration."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from transformer_jax.base import Bound, declared_limits
from transformer_jax.config import SETTINGS, check_run_config, check_settings, default_config
from transformer_jax.config.settings import Setting
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import ConfigError
from transformer_jax.model.config import TransformerConfig

LIMITED = [setting for setting in SETTINGS if setting.bound is not None or setting.choices]


def _next(end: float, direction: float, in_float32: bool) -> float:
    """The number next to `end` towards `direction` (in float32 for a bound compared there)."""
    if in_float32:
        return float(np.nextafter(np.float32(end), np.float32(direction)))
    return math.nextafter(end, direction)


def edges(bound: Bound, kind: type) -> tuple[list, list]:
    """(values just inside `bound`, values just outside it) of type `kind`: at each finite end, the nearest number
    on either side (the next integer, the next float, the next float32); the values `also` admits are inside, and
    a value outside that `also` admits is stepped past it."""
    inside, outside = list(bound.also), []
    for end, is_open, away in ((bound.low, bound.open_low, -1), (bound.high, bound.open_high, 1)):
        if end is None:
            continue
        if math.isinf(end):  # "finite in float32": the largest float32 is in, what overflows it is out
            inside.append(float(np.finfo(np.float32).max))
            outside.append(1e39)
            continue
        if kind is int:
            near_in, near_out = (end - away, end) if is_open else (end, end + away)
            while near_out in bound.also:
                near_out += away
        else:
            toward, past = -away * math.inf, away * math.inf
            near_in = _next(end, toward, bound.in_float32) if is_open else float(end)
            near_out = float(end) if is_open else _next(end, past, bound.in_float32)
        inside.append(kind(near_in))
        outside.append(kind(near_out))
    return inside, outside


def near_misses(choices: tuple) -> list:
    """Values beside the choices: each one misspelt by a character, and in capitals where that differs."""
    misses = [f"{choice}x" for choice in choices]
    return misses + [choice.upper() for choice in choices if choice.upper() != choice]


def with_value(setting: Setting, value):
    config = default_config()
    config[setting.section][setting.name] = value
    return config


@pytest.mark.parametrize("setting", LIMITED, ids=lambda setting: setting.key)
def test_just_outside_a_declared_limit_is_refused_in_one_line_naming_the_key_and_its_flag(setting):
    values = edges(setting.bound, setting.type)[1] if setting.bound is not None else near_misses(setting.choices)
    assert values, setting.key
    for value in values:
        with pytest.raises(ConfigError) as refused:
            check_run_config(with_value(setting, value))
        message = str(refused.value)
        assert message.startswith(f"{setting.key}={value!r} "), message
        assert f"; set --config.{setting.key} " in message and "\n" not in message, message
        if setting.bound is not None:
            assert f" must be {setting.bound.wording};" in message
        else:
            assert f" is not one of {list(setting.choices)};" in message


@pytest.mark.parametrize("setting", LIMITED, ids=lambda setting: setting.key)
def test_just_inside_a_declared_limit_and_every_choice_is_accepted(setting):
    values = edges(setting.bound, setting.type)[0] if setting.bound is not None else list(setting.choices)
    assert values, setting.key
    for value in values:
        check_settings(with_value(setting, value))  # each setting alone; the combination's checks are their own


def test_the_table_covers_every_limited_setting_the_issue_named():
    keys = {setting.key for setting in LIMITED}
    assert {"model.vocab_size", "model.num_layers", "model.d_model", "model.d_ff", "model.num_heads", "model.max_len",
            "model.dropout_rate", "model.attention_dropout_rate", "model.layer_norm_epsilon", "model.dtype",
            "model.param_dtype", "model.attention_backend", "data.source", "data.tokenizer_type", "eval.alpha",
            "eval.dtype", "eval.beam_size", "eval.max_extra_length", "data.eval_batch_size",
            "eval.batch_tokens"} <= keys


def declared_fields(owner: type) -> list[tuple[type, str]]:
    return [(owner, name) for name, (_, bound, choices) in declared_limits(owner).items() if bound or choices]


@pytest.mark.parametrize("owner, name", declared_fields(TransformerConfig) + declared_fields(DecodeOptions)
                         + declared_fields(TranslationBatching), ids=lambda item: getattr(item, "__name__", item))
def test_the_python_objects_refuse_and_accept_by_the_same_declaration(owner, name):
    kind, bound, choices = declared_limits(owner)[name]
    inside, outside = edges(bound, kind) if bound is not None else (list(choices), near_misses(choices))
    base = {"num_heads": 1} if owner is TransformerConfig and name != "num_heads" else {}  # any d_model divides
    for value in inside:
        assert getattr(owner(**base, **{name: value}), name) == value
    for value in outside:
        with pytest.raises(ConfigError) as refused:
            owner(**base, **{name: value})
        assert str(refused.value).startswith(f"{name}={value!r} "), str(refused.value)


def test_the_run_rows_read_the_declaration_of_the_model_and_the_search():
    rows = {setting.key: setting for setting in SETTINGS}
    for owner, section, names in ((TransformerConfig, "model", None),
                                  (DecodeOptions, "eval", ("beam_size", "alpha", "max_extra_length")),
                                  (TranslationBatching, "", {"batch_size": "data.eval_batch_size",
                                                             "batch_tokens": "eval.batch_tokens"})):
        for field in dataclasses.fields(owner):
            if names is not None and field.name not in names or field.name == "vocab_size":
                continue
            _, bound, choices = declared_limits(owner)[field.name]
            row = rows[names[field.name] if isinstance(names, dict) else f"{section}.{field.name}"]
            assert (row.default, row.bound, row.choices) == (field.default, bound, choices), row.key
    assert rows["model.vocab_size"].bound.admits(0)  # the run's own: 0 takes the tokenizer's size


def test_float16_is_refused_with_the_choices_and_the_help_says_why():
    for key in ("model.dtype", "model.param_dtype"):
        setting = next(setting for setting in SETTINGS if setting.key == key)
        with pytest.raises(ConfigError, match=rf"^{key}='float16' is not one of \['float32', 'bfloat16'\]; "
                                              rf"set --config\.{key} to one of them$"):
            check_run_config(with_value(setting, "float16"))
    help_text = next(setting.help for setting in SETTINGS if setting.key == "model.dtype")
    assert "float16 is not offered" in help_text
    with pytest.raises(ConfigError, match=r"^dtype='float16' is not one of \['float32', 'bfloat16'\]$"):
        TransformerConfig(dtype="float16")


def test_max_extra_length_is_positive_in_the_declaration_the_docs_and_the_search():
    setting = next(setting for setting in SETTINGS if setting.key == "eval.max_extra_length")
    assert not setting.bound.admits(0) and setting.bound.admits(1) and setting.bound.short == "[1, 2**30]"
    with pytest.raises(ConfigError, match=r"^eval\.max_extra_length=0 must be a positive integer"):
        check_run_config(with_value(setting, 0))
    with pytest.raises(ConfigError, match=r"^max_extra_length=0 must be a positive integer"):
        DecodeOptions(max_extra_length=0)
