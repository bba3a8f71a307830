"""The run config: every setting of a run declared once, the checks and the reference generated from it.

`settings` (each setting's key, default, type, bound or choices and meaning; default_config) -> `derived` (settings
computed from others, recomputed after overrides) -> `schema` (check_run_config: each setting, then their
combination; the model config and decoding options of a run, a run's saved config.json) -> `reference`
(docs/configuration.md's table and --config_help), `parallel_text` (a run for your own text files, sized from the
corpus).
"""

from transformer_jax.config.parallel_text import parallel_text_config, sizing_line
from transformer_jax.config.reference import plain_text
from transformer_jax.config.schema import (
    check_combination,
    check_run_config,
    check_settings,
    decode_options,
    decoding_dtype,
    model_config,
    read_run_config,
    translation_batching,
    write_run_config,
)
from transformer_jax.config.settings import SETTINGS, Setting, default_config, nearest_key

__all__ = [
    "SETTINGS", "Setting", "check_combination", "check_run_config", "check_settings", "decode_options",
    "decoding_dtype", "default_config", "model_config", "nearest_key", "parallel_text_config", "plain_text",
    "read_run_config", "sizing_line", "translation_batching", "write_run_config",
]
