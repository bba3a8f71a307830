"""Derived settings (transformer_jax/config/derived.py): computed from the final values of the settings they follow,
fixed once set, kept through copies and config.json, and an explicit value beyond its limit refused."""

import copy
import functools
import json

import pytest

from transformer_jax.config import default_config
from transformer_jax.config.derived import check_derived, derive, derived_settings
from transformer_jax.errors import ConfigError


def fifth(steps: int) -> int:
    return max(1, steps // 5)


def run_config():
    config = default_config()
    config.training.num_train_steps = 100
    derive(config, "training.warmup_steps", fifth, "training.num_train_steps", at_most="training.num_train_steps",
           reason="the warm-up would never end")
    derive(config, "training.log_every", functools.partial(max, 1), "training.warmup_steps")
    config.lock()  # as --config's file is loaded
    return config


def test_a_derived_setting_follows_the_final_value_of_what_it_derives_from_through_a_chain():
    config = run_config()
    assert (config.training.warmup_steps, config.training.log_every) == (20, 20)
    config.training.num_train_steps = 30  # an override, after the config file made its choices
    assert (config.training.warmup_steps, config.training.log_every) == (6, 6)
    assert json.loads(config.to_json_best_effort())["training"]["warmup_steps"] == 6  # config.json holds the value
    assert sorted(derived_settings(config)) == ["training.log_every", "training.warmup_steps"]
    assert derived_settings(default_config()) == {}


def test_setting_a_derived_setting_fixes_it_and_its_dependents_follow_it():
    config = run_config()
    config.training.warmup_steps = 7
    config.training.num_train_steps = 10
    assert (config.training.warmup_steps, config.training.log_every) == (7, 7)
    assert [key for key, setting in derived_settings(config).items() if setting.explicit] == ["training.warmup_steps"]
    check_derived(config)


def test_a_copy_derives_from_its_own_values():
    config = run_config()
    copied = copy.deepcopy(config)
    copied.training.num_train_steps = 50
    assert (copied.training.warmup_steps, config.training.warmup_steps) == (10, 20)
    resolved = config.copy_and_resolve_references()
    assert resolved.training.warmup_steps == 20 and derived_settings(resolved) == {}


def test_an_explicit_value_beyond_its_limit_is_one_line_naming_both_keys_and_the_fix():
    config = run_config()
    config.training.warmup_steps = 200
    with pytest.raises(ConfigError) as error:
        check_derived(config)
    assert str(error.value) == (
        "training.warmup_steps=200 is more than training.num_train_steps=100 (the warm-up would never end); set "
        "--config.training.warmup_steps to 100 or less, or leave it out to have it derived from "
        "training.num_train_steps")
