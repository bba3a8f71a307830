"""Training: the paper's loss and optimizer, the train state and step, the loop and its checkpoints.

`loss` (label smoothing, section 5.4) -> `optimizer` (the warm-up schedule and Adam, section 5.3) ->
`state` (TrainState) -> `step` (one update, gradient accumulation, eval sums) -> `jitted_steps`
(those steps jitted for the run's mesh) -> `checkpoint_integrity` (checksums, finiteness and shape
checks, damaged checkpoints set aside) -> `checkpoints` (Checkpointer: Orbax save/restore) ->
`metrics_log` (metrics.jsonl, timing.jsonl, TensorBoard) -> `log_window` (the train log line of each
window, the progress bar) -> `periodic_eval` (dev loss and BLEU on a step schedule) -> `preemption`
(StopFlag) -> `loop` (Trainer: builds the run and trains it, resuming).

The loss, schedule, state and step need only the base install (`pip install transformer-jax`);
the loop, checkpoints and logs need the `train` extra.
"""

import importlib
from typing import Any

from transformer_jax.training.loss import label_smoothed_cross_entropy
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import TrainState, create_train_state
from transformer_jax.training.step import eval_step, train_step

# The loss, schedule, state and step need only the base install; the loop and its checkpoints need the
# `train` extra (Orbax, the data pipeline, tqdm), so they load on first use.
_NEED_TRAIN_EXTRA = {"Checkpointer": "transformer_jax.training.checkpoints", "Trainer": "transformer_jax.training.loop"}


def __getattr__(name: str) -> Any:
    """Checkpointer and Trainer, imported when first asked for."""
    if name in _NEED_TRAIN_EXTRA:
        return getattr(importlib.import_module(_NEED_TRAIN_EXTRA[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Checkpointer", "TrainState", "Trainer", "create_train_state", "eval_step", "label_smoothed_cross_entropy",
    "paper_learning_rate", "paper_optimizer", "train_step",
]
