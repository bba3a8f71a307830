"""Checkpoints: Orbax save and restore, integrity checks, choosing and averaging a run's checkpoints.

`integrity` (per-array checksums, finiteness and shape checks; damaged checkpoints set aside) ->
`restoring` (CheckpointReader: the steps listed, metadata, the best step, a state or its parameters restored) ->
`manager` (Checkpointer: the state, the data position and metadata saved with Orbax, and restored as a reader) ->
`saved_run` (`Run`: a training run on disk, reopened by `open_run`; its config alone, `run_config_of`) ->
`selection` (latest, best, a step or the average of the last N; writing parameters) -> `initial` (fine-tuning from
another run). This is the only folder that imports Orbax.
"""

from transformer_jax.checkpoints.initial import adopt_initial_model
from transformer_jax.checkpoints.manager import Checkpointer, best_metric_for
from transformer_jax.checkpoints.saved_run import Run, open_run, run_config_of
from transformer_jax.checkpoints.selection import checkpoint_params, select_steps, write_params

__all__ = [
    "Checkpointer",
    "Run",
    "adopt_initial_model",
    "best_metric_for",
    "checkpoint_params",
    "open_run",
    "run_config_of",
    "select_steps",
    "write_params",
]
