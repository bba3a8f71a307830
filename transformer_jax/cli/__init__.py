"""The `transformer-jax` commands (transformer_jax/__main__.py dispatches to them) and what they share.

Shared: `lock` (one job owns a run directory) -> `commands` (flag parsing, one-line user errors, workdir checks
and ownership, multi-process start-up) -> `stops` (Ctrl-C and SIGTERM as one line, the process's exit) ->
`run_flags` (the flags of the commands that use a trained run); `old_forms` (eval.py's flags of old).
One module a command, each defining only its own flags: `train`, `prepare`, `import_marian`, `score`,
`translate`, `translate_corpus`, `average`, `export`, `plot` (the preflight is aot/preflight.py; it takes
`translate_corpus`'s search flags to price a bulk job).
"""

from transformer_jax.base import storage_named  # a storage fault as one line (train.py, eval.py)
from transformer_jax.cli.commands import (
    ClusterFlags,
    define_cluster_flags,
    initialize_distributed,
    parse_flags,
    refuse_blank,
    training_kept,
    training_workdir,
    user_errors,
)
from transformer_jax.cli.old_forms import eval_command
from transformer_jax.cli.run_flags import SearchFlags, define_search_flags
from transformer_jax.cli.stops import early_signals, interrupts_reported, run_command, signals_held

__all__ = [
    "ClusterFlags", "SearchFlags", "define_cluster_flags", "define_search_flags", "early_signals", "eval_command",
    "initialize_distributed", "interrupts_reported", "parse_flags", "refuse_blank", "run_command", "signals_held", "storage_named",
    "training_kept", "training_workdir", "user_errors",
]
