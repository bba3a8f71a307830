"""Checkpoints: Orbax save and restore, integrity checks, choosing and averaging a run's checkpoints.

`integrity` (per-array checksums, finiteness and shape checks; damaged checkpoints set aside) ->
`manager` (Checkpointer: the state, the data position and metadata, saved and restored with Orbax) ->
`selection` (reopening a finished run; latest, best, a step or the average of the last N; writing
parameters). This is the only folder that imports Orbax.
"""

from transformer_jax.checkpoints.initial import adopt_initial_model
from transformer_jax.checkpoints.manager import Checkpointer, best_metric_for
from transformer_jax.checkpoints.selection import Run, checkpoint_params, open_run, select_steps, write_params

__all__ = [
    "Checkpointer",
    "Run",
    "adopt_initial_model",
    "best_metric_for",
    "checkpoint_params",
    "open_run",
    "select_steps",
    "write_params",
]
