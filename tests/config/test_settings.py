"""The settings' declaration (transformer_jax/config/settings.py): the run config built from it, and each type and
choice declared there enforced by check_run_config in one line naming the key and what it allows (every bound and
choice of the table: test_settings_table.py)."""

import pytest

from transformer_jax.config import SETTINGS, check_run_config, default_config
from transformer_jax.errors import ConfigError


def refusal(key: str, value) -> str:
    config = default_config()
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError) as error:
        check_run_config(config)
    return str(error.value)


def test_the_default_config_holds_every_setting_at_its_declared_default_and_passes():
    config = default_config()
    keys = [f"{section}.{key}" for section, values in config.items() for key in values]
    assert sorted(keys) == sorted(s.key for s in SETTINGS) and len(keys) == len(SETTINGS)
    assert all(config[s.section][s.name] == s.default for s in SETTINGS)
    check_run_config(config)


def test_a_declared_choice_is_enforced():
    assert refusal("training.loss_kernel", "triton") == ("training.loss_kernel='triton' is not one of ['auto', "
                                                         "'pallas', 'xla']; set --config.training.loss_kernel to one "
                                                         "of them")


def test_a_value_of_another_type_is_refused_naming_the_key():
    config = default_config()
    # A config file may replace a section's values wholesale; ml_collections' own type check is then bypassed.
    config.data = dict(config.data, max_length=64.5)
    with pytest.raises(ConfigError, match=r"^data.max_length=64.5 must be positive; set --config.data.max_length"):
        check_run_config(config)
    config = default_config()
    config.data = dict(config.data, source_lang=3)
    with pytest.raises(ConfigError, match=r"^data.source_lang=3 must be a str, like its default 'en'"):
        check_run_config(config)
