"""Training: the paper's loss and optimizer, the train state and step, the run builder and the loop.

`loss` (label smoothing, section 5.4) -> `optimizer` (the warm-up schedule and Adam, section 5.3) ->
`state` (TrainState) -> `step` (one update, gradient accumulation, eval sums) -> `programs` (the run
builder: a run's state layout and jitted programs on its mesh, shared by the Trainer, eval.py, the
preflight and the benchmarks) -> `dev_loss` (loss over a split) -> `metrics_log`, `progress`,
`log_window` (metrics.jsonl, TensorBoard, the log line and progress bar) -> `periodic_eval` (dev loss
and BLEU on a step schedule) -> `preemption` (StopFlag) -> `prefetch` (batches built ahead in the
background) -> `loop` (Trainer: builds the run and trains it, resuming from `transformer_jax.checkpoints`).

The loss, schedule, state and step need only the base install (`pip install transformer-jax`);
the builder, the loop and its logs need the `train` extra.
"""

import importlib
from typing import Any

from transformer_jax.training.loss import label_smoothed_cross_entropy
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import TrainState, create_train_state
from transformer_jax.training.step import eval_step, train_step

# Loaded on first use: they need the `train` extra (ml_collections, Orbax, the data pipeline, tqdm).
_NEED_TRAIN_EXTRA = {
    "RunPrograms": "transformer_jax.training.programs", "build_run": "transformer_jax.training.programs",
    "evaluate_loss": "transformer_jax.training.dev_loss", "Trainer": "transformer_jax.training.loop",
    "StopAgreement": "transformer_jax.training.preemption", "StopFlag": "transformer_jax.training.preemption",
}


def __getattr__(name: str) -> Any:
    """The builder, dev loss, preemption flags and Trainer, imported when first asked for."""
    if name in _NEED_TRAIN_EXTRA:
        return getattr(importlib.import_module(_NEED_TRAIN_EXTRA[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RunPrograms", "StopAgreement", "StopFlag", "TrainState", "Trainer", "build_run", "create_train_state", "eval_step", "evaluate_loss",
    "label_smoothed_cross_entropy", "paper_learning_rate", "paper_optimizer", "train_step",
]
