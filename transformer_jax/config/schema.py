"""A run config checked against the declaration of every setting (config/settings.py), and a run's saved config.

`check_run_config` checks each setting's type and bound or choices as declared (`check_settings`), then the settings
that constrain each other (`check_combination`); a key the declaration lacks (a typo in a config file) fails at
start-up.
"""

from __future__ import annotations

import importlib.util
import json
import math
from typing import Any

import ml_collections

from transformer_jax.base import check_value, is_number, run_keys
from transformer_jax.base import workdir as layout
from transformer_jax.base.files import read_text, write_atomically
from transformer_jax.config.derived import check_derived
from transformer_jax.config.settings import MAX_INT32, MAX_STEP, SETTINGS, Setting, default_config, nearest_key
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.model.config import TransformerConfig


def check_run_config(config: ml_collections.ConfigDict) -> None:
    """Fail with one ConfigError line on a setting no run can use, before any data or device work: each setting
    alone (`check_settings`), then the settings that constrain each other (`check_combination`)."""
    check_settings(config)
    check_combination(config)


def check_settings(config: ml_collections.ConfigDict) -> None:
    """Every key a setting of the declaration, each value of its type and inside its declared bound or choices; a
    refusal names the key and its `--config.` flag."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() returned a {type(config).__name__}, not an ml_collections.ConfigDict; "
                          "start from transformer_jax.config.default_config() and change its values (see configs/)")
    _check_known_keys(config)
    for setting in SETTINGS:
        check_setting(setting, config[setting.section][setting.name])


def check_combination(config: ml_collections.ConfigDict) -> None:
    """The settings that constrain each other (and wandb_project's library), each already inside its own limits
    (`check_settings`): the model's own checks, with the vocabulary the tokenizer will have, among them."""
    if config.training.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"training.wandb_project={config.training.wandb_project!r} needs Weights & Biases, which "
                          "is not installed; pip install 'transformer_jax[wandb]', or leave wandb_project empty")
    if config.data.row_width > config.data.max_length:
        raise ConfigError(f"data.row_width={config.data.row_width} is wider than data.max_length="
                          f"{config.data.max_length}; lower it, or set 0 to choose it from the corpus")
    check_derived(config)
    vocab_size = config.model.vocab_size or config.data.vocab_size
    model_config(config, vocab_size)
    if 2 * config.eval.beam_size > vocab_size:  # beam search keeps 2 x beam candidates among the vocabulary
        raise ConfigError(f"eval.beam_size={config.eval.beam_size} needs a vocabulary of at least "
                          f"{2 * config.eval.beam_size} pieces (it has {vocab_size}); set --config.eval.beam_size lower")


def check_setting(setting: Setting, value: Any) -> None:
    """Fail with one ConfigError line naming the setting when `value` is not of its type, or not inside its bound
    or choices as declared."""
    key, spelling = setting.key, run_keys(setting.section)
    number = is_number(value, setting.type)
    if setting.type in (int, float):
        if number and isinstance(value, float) and not math.isfinite(value):  # inf passes every "> 0" bound
            raise ConfigError(f"{key}={value!r} must be a finite number; set --config.{key}")
        check_value(setting.name, value, setting.bound, (), spelling, number)
        if not number:
            kind = "an integer" if setting.type is int else "a number"
            raise ConfigError(f"{key}={value!r} must be {kind}; set --config.{key}")
        if setting.steps and value > MAX_STEP:  # the state's step counter is int32
            raise ConfigError(f"{key}={value} is more steps than a run counts (2**31 - 1); set --config.{key} lower")
        # Sizes and counts become int32 on the devices (shapes, token ids); a bound of its own (the seed's) rules.
        if isinstance(value, int) and abs(value) > MAX_INT32 and (setting.bound is None or setting.bound.high is None):
            raise ConfigError(f"{key}={value} is larger than a run can hold (2**31 - 1: sizes and counts are 32-bit "
                              f"on the devices); set --config.{key} lower")
    elif not isinstance(value, setting.type):
        raise ConfigError(f"{key}={value!r} must be a {setting.type.__name__}, like its default {setting.default!r}; "
                          f"set --config.{key}")
    check_value(setting.name, value, None, setting.choices, spelling)
    if setting.names and value and not value.strip():  # "" is each one's default; spaces name nothing
        raise ConfigError(f"{key} is blank (only spaces); pass {setting.names}, or leave the setting out")


def _check_known_keys(config: ml_collections.ConfigDict) -> None:
    """A section missing, or a key the declaration lacks (a typo in a config file: `num_train_step`), is an error, not
    a setting ignored."""
    import difflib

    schema = default_config()
    missing = [section for section in schema if section not in config]
    if missing:
        raise ConfigError(f"the config has no {', '.join(missing)} section; start get_config() from "
                          "transformer_jax.config.default_config() (see configs/)")
    for section, values in config.items():
        if not isinstance(values, ml_collections.ConfigDict):
            raise ConfigError(f"the config's {section!r} is not a section of settings; a run config has the "
                              f"sections {', '.join(schema)} (start get_config() from default_config())")
        if section not in schema:
            close = difflib.get_close_matches(section, list(schema), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise ConfigError(f"config section {section!r} is not one of {', '.join(schema)}{hint}; remove it from the "
                              "config file")
        for key in values:
            if key not in schema[section]:
                close = nearest_key(f"{section}.{key}")
                hint = f' (did you mean "{close}"?)' if close else ""
                raise ConfigError(f"config key {section}.{key} is not a setting{hint}; correct it in the config file "
                                  "(every key: docs/configuration.md)")


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
    """The TransformerConfig of a run, with the vocabulary size taken from (and checked against) the tokenizer."""
    return TransformerConfig.for_run(config.model, vocab_size, config.data.max_length)


def write_run_config(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Save the run's config as `<workdir>/config.json` (the evaluation commands rebuild the model from it)."""
    write_atomically(layout.run_path(workdir, layout.CONFIG), config.to_json_best_effort(indent=2))


def read_run_config(path: str, complete: bool = False) -> ml_collections.ConfigDict:
    """A run's saved config (`<workdir>/config.json`) as the full schema, every saved value in place.

    Raises CheckpointError naming the file when it is missing, not JSON, or not a run config. `complete`
    (a rerun of the settings, configs/rerun.py): a setting of the schema the file lacks is an error too, not
    the default taken without a word (a file from an older version, or edited by hand).
    """
    repair = ("restore it, or run train.py on the workdir again with the --config it was trained with "
              "(train.py writes config.json anew)")
    try:
        saved = json.loads(read_text(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist; pass the config.json a training run wrote") from None
    except (ValueError, UnicodeDecodeError) as error:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"{path} is damaged ({str(error).splitlines()[0]}); {repair}") from None
    config = default_config()
    try:
        _merge(config, saved, "")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        detail = error.args[0] if isinstance(error, KeyError) else error
        raise CheckpointError(f"{path} is not a run config of this project ({detail}); {repair}") from None
    defaults = flat_settings(config)
    missing = [key for key in defaults if key not in flat_settings(saved)] if complete else []
    if missing:
        named = ", ".join(f"{key}={defaults[key]!r}" for key in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise CheckpointError(
            f"{path} lacks {len(missing)} setting(s) a rerun needs ({named}{more}: the defaults, which the run "
            f"it records may not have used); add each with the value that run used to {path}, or start from a "
            "packaged config (--config=demo, ...) with --config.KEY=VALUE") from None
    try:
        check_run_config(config)  # a hand-edited value: name the file it is in, not a flag
    except ConfigError as error:
        raise CheckpointError(f"{path} holds a setting no run can use: {error}".split("; set --config")[0]
                              + f"; correct it in {path}, or {repair}") from None
    return config


def flat_settings(values: Any, prefix: str = "") -> dict[str, Any]:
    """{"section.key": value} of every setting in a nested dict or ConfigDict (a saved config.json, a run config),
    in order."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (dict, ml_collections.ConfigDict)):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _merge(config: ml_collections.ConfigDict, saved: Any, prefix: str) -> None:
    """Set every key of the `saved` dict in `config`; a key the schema lacks or a section gone is an error."""
    if not isinstance(saved, dict):
        raise TypeError(f"{prefix or 'the file'} is not a JSON object")
    for section in config.keys() if not prefix else ():
        if section not in saved:
            raise KeyError(f"no {section!r} section")
    for key, value in saved.items():
        if key not in config:
            raise KeyError(f"unknown key {prefix}{key}")
        if isinstance(config[key], ml_collections.ConfigDict):
            _merge(config[key], value, f"{prefix}{key}.")
        else:
            config[key] = value


def decode_options(config: ml_collections.ConfigDict) -> DecodeOptions:
    """The run's search settings: beam search with its `eval` section."""
    evaluation = config.eval
    return DecodeOptions(mode="beam", beam_size=evaluation.beam_size, alpha=evaluation.alpha,
                         max_extra_length=evaluation.max_extra_length)


def translation_batching(config: ml_collections.ConfigDict) -> TranslationBatching:
    """How the run cuts a split into translation batches: `data.eval_batch_size` sentences at most, and
    `eval.batch_tokens` source token slots (runs saved before it had none)."""
    return TranslationBatching(config.data.eval_batch_size, config.eval.get("batch_tokens", 0))


def decoding_dtype(config: ml_collections.ConfigDict) -> str:
    """The dtype the run decodes in (`eval.dtype`; "" the model's own; runs saved before it had none)."""
    return config.eval.get("dtype", "")
