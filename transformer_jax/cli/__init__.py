"""The `transformer-jax` commands (transformer_jax/__main__.py dispatches to them) and what they share.

Shared: `user_errors` (one-line errors and the exit statuses) -> `flag_parsing` (config files found, flags parsed,
--help) -> `cluster` (joining a multi-process run, JAX's backends started) -> `run_directory` (workdir checks,
a training run's workdir owned through base/lock.py, what a stop kept) -> `stops` (Ctrl-C and SIGTERM as one
line, the process's exit) -> `run_flags` (the flags of the commands that use a trained run); `old_forms` (eval.py's flags of old).
One module a command, each defining only its own flags: `train`, `prepare`, `import_marian`, `score`,
`translate`, `translate_corpus`, `average`, `export`, `plot` (the preflight is aot/preflight.py; it takes
`translate_corpus`'s search flags to price a bulk job).
"""

from transformer_jax.base import storage_named  # a storage fault as one line (train.py, eval.py)
from transformer_jax.cli.cluster import ClusterFlags, define_cluster_flags, initialize_distributed
from transformer_jax.cli.flag_parsing import parse_flags, refuse_blank
from transformer_jax.cli.run_directory import training_kept, training_workdir
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.old_forms import eval_command
from transformer_jax.cli.run_flags import SearchFlags, define_search_flags
from transformer_jax.cli.stops import early_signals, interrupts_reported, run_command, signals_held

__all__ = [
    "ClusterFlags", "SearchFlags", "define_cluster_flags", "define_search_flags", "early_signals", "eval_command",
    "initialize_distributed", "interrupts_reported", "parse_flags", "refuse_blank", "run_command", "signals_held", "storage_named",
    "training_kept", "training_workdir", "user_errors",
]
