"""Run-level pieces: the run config's schema and reference, the CLIs' shared helpers, the device mesh.

`config_schema` (every run setting, its default and checks) -> `config_reference` (the README's
table, generated) -> `sharding` (device mesh, logical-axis rules, shardings) -> `files` (atomic
writes) -> `lock` (one job per run directory) -> `cli` (one-line user errors, Ctrl-C, workdir checks
and ownership, multi-process start-up).
"""

from transformer_jax.run.config_schema import (
    check_run_config,
    decode_options,
    default_config,
    model_config,
)
from transformer_jax.run.sharding import batch_sharding, make_mesh, state_shardings

__all__ = [
    "batch_sharding", "check_run_config", "decode_options", "default_config", "make_mesh", "model_config",
    "state_shardings",
]
