"""Training, the paper's part: the loss, the optimizer, the train state and the step.

`loss` (label smoothing, section 5.4; the chunked projection and loss) -> `loss_kernel` (the fused
projection-and-loss kernel) -> `optimizer` (the warm-up schedule and Adam, section 5.3) -> `state`
(TrainState) -> `step` (one update, gradient accumulation, eval sums) -> `dev_loss` (a split's loss, perplexity
and accuracy and their jitted step, shared by the training run and the score command; it reads the data
pipeline's corpora, so it needs the `train` extra and this `__init__` does not import it).

These need only the base install (`pip install transformer-jax`). A run that uses them (assembled from a config,
trained by the loop, logged and checkpointed) is `transformer_jax.run`, which needs the `train` extra.
"""

from transformer_jax.training.loss import label_smoothed_cross_entropy
from transformer_jax.training.loss_kernel import logits_matmul_flops
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import TrainState, create_train_state
from transformer_jax.training.step import eval_step, train_step

__all__ = [
    "TrainState",
    "create_train_state",
    "eval_step",
    "label_smoothed_cross_entropy",
    "logits_matmul_flops",
    "paper_learning_rate",
    "paper_optimizer",
    "train_step",
]
