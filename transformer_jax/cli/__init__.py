"""The command-line layer train.py, eval.py and `python -m transformer_jax.aot` share.

`lock` (one job owns a run directory) -> `commands` (flag parsing, one-line user errors, workdir checks
and ownership, multi-process start-up) -> `stops` (Ctrl-C and SIGTERM as one line, the process's exit).
"""

from transformer_jax.base.files import storage_named  # a storage fault as one line (train.py, eval.py)
from transformer_jax.cli.commands import (
    ClusterFlags,
    define_cluster_flags,
    initialize_distributed,
    parse_flags,
    training_kept,
    training_workdir,
    user_errors,
)
from transformer_jax.cli.stops import interrupts_reported, run_command, signals_held

__all__ = [
    "ClusterFlags",
    "define_cluster_flags",
    "initialize_distributed",
    "interrupts_reported",
    "parse_flags",
    "run_command",
    "signals_held",
    "storage_named",
    "training_kept",
    "training_workdir",
    "user_errors",
]
