"""The jitted steps: one optimizer update (with gradient accumulation) and the summed dev-set metrics of a batch."""

from __future__ import annotations

from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import optax

from transformer_jax.model.special_tokens import PAD_ID
from transformer_jax.training.loss import ProjectedLoss, label_smoothed_cross_entropy
from transformer_jax.training.state import TrainState

Batch = dict[str, jax.Array]


Metrics = dict[str, jax.Array]


def _model_inputs(batch: Batch) -> dict[str, jax.Array | None]:
    return dict(
        src_positions=batch.get("inputs_position"),
        tgt_positions=batch.get("targets_position"),
        src_segments=batch.get("inputs_segmentation"),
        tgt_segments=batch.get("targets_segmentation"),
    )


def _token_metrics(logits_BxTxV: jax.Array, targets_BxT: jax.Array, smoothing: float) -> Metrics:
    """Per-token [B, T] label-smoothed loss, NLL, correct token and non-pad weight (padding weighs 0)."""
    loss_BxT, nll_BxT = label_smoothed_cross_entropy(logits_BxTxV, targets_BxT, smoothing)
    weights_BxT = (targets_BxT != PAD_ID).astype(jnp.float32)
    # "Correct" = the reference has the highest logit (ties count as correct). A max is one vectorized
    # pass over the logits; XLA's argmax (a variadic reduce) is several times slower on CPU.
    logits_BxTxV = jax.lax.stop_gradient(logits_BxTxV)
    reference_BxT = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], -1)[..., 0]
    correct_BxT = (reference_BxT >= logits_BxTxV.max(-1)).astype(jnp.float32)
    return {"loss": loss_BxT * weights_BxT, "nll": nll_BxT * weights_BxT, "correct": correct_BxT * weights_BxT,
            "tokens": weights_BxT}


def _outputs(params: Any, apply_fn: Callable, batch: Batch, dropout_key: jax.Array | None,
             hidden_only: bool = False) -> jax.Array:
    """The model's logits of `batch` (or the decoder's hidden states when `hidden_only`); dropout with a key."""
    deterministic = dropout_key is None
    return apply_fn(
        {"params": params}, batch["inputs"], batch["target_inputs"], **_model_inputs(batch),
        deterministic=deterministic, rngs=None if deterministic else {"dropout": dropout_key},
        **({"hidden_only": True} if hidden_only else {}),
    )


def loss_sums(
    params: Any, apply_fn: Callable, batch: Batch, smoothing: float, dropout_key: jax.Array | None,
    projected: ProjectedLoss | None = None,
) -> tuple[jax.Array, Metrics]:
    """Summed label-smoothed loss over non-pad target tokens, and summed metrics (not yet averaged).

    With `projected`, the pre-softmax projection and the loss are formed a chunk of tokens at a time
    (training/loss.py's `projected_cross_entropy_sums`: no float32 logits of the whole batch).
    """
    outputs = _outputs(params, apply_fn, batch, dropout_key, hidden_only=projected is not None)
    if projected is not None:
        sums = projected.sums(params, outputs, batch["targets"], smoothing)
        return sums["loss"], sums
    sums = {key: value.sum() for key, value in _token_metrics(outputs, batch["targets"], smoothing).items()}
    return sums["loss"], sums


def step_dropout_key(state: TrainState) -> jax.Array:
    """The dropout key of this step: derived from the seed and the step, so reruns repeat exactly."""
    return jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)


def compute_gradients(
    state: TrainState, batch: Batch, smoothing: float, micro_step: int | jax.Array = 0,
    projected: ProjectedLoss | None = None,
) -> tuple[Any, Metrics]:
    """Gradients of the summed loss of one (micro-)batch, and its summed metrics (`projected`: see loss_sums)."""
    dropout_key = jax.random.fold_in(step_dropout_key(state), micro_step)
    grad_fn = jax.grad(loss_sums, has_aux=True)
    return grad_fn(state.params, state.apply_fn, batch, smoothing, dropout_key, projected)


# How a step with non-finite gradients is skipped: "cond" branches (XLA:CPU then updates the donated state in
# place, 2.3x faster than "select" for the base model's update on CPU); "select" computes the update and keeps
# the old values where it must (jnp.where inside the update's own fusions: on TPUs XLA copies the state around
# a branch, 5.7 GB against 3.1 GB of HBM traffic per update for the base model on v5e). See BENCHMARKS.md.
SkipBy = Literal["cond", "select"]


def skip_by_for(platform: str) -> SkipBy:
    """The way to skip an update that is cheaper on `platform` ("cpu", "gpu", "tpu")."""
    return "cond" if platform == "cpu" else "select"


# How the gradient's global norm (the finiteness check and the `grad_norm` metric) is reduced: "leaves", one
# reduction per parameter array (optax.tree.norm); "shape_groups", one per group of arrays of one shape, stacked.
# On GPUs each reduction is a kernel launch of its own: for the base model at 12 rows per H100 the groups take the
# update from 597 to 275 launches (1,760 to 1,556 per update) for 0.2% more bytes. On TPUs the stacked groups are
# written out (+2.4% HBM bytes per update on v5e-8), so TPUs and CPUs keep "leaves". See BENCHMARKS.md.
NormBy = Literal["leaves", "shape_groups"]


def norm_by_for(platform: str) -> NormBy:
    """The gradient-norm reduction that is cheaper on `platform` ("cpu", "gpu", "tpu")."""
    return "shape_groups" if platform == "gpu" else "leaves"


def global_norm(tree: Any, norm_by: NormBy = "leaves") -> jax.Array:
    """The L2 norm of all arrays of `tree` together (float32), reduced as `norm_by` says (see NormBy)."""
    if norm_by == "leaves":
        return optax.tree.norm(tree)
    groups: dict[tuple, list[jax.Array]] = {}
    for leaf in jax.tree.leaves(tree):
        groups.setdefault((leaf.shape, leaf.dtype), []).append(leaf)
    squares = [jnp.sum(jnp.square(jnp.stack(group).astype(jnp.float32))) for group in groups.values()]
    return jnp.sqrt(sum(squares))


def apply_gradients(state: TrainState, grad_sums: Any, sums: Metrics, skip_by: SkipBy = "cond",
                    norm_by: NormBy = "leaves") -> tuple[TrainState, Metrics]:
    """Normalize summed gradients by the batch's non-pad target tokens and take one Adam step.

    A non-finite loss or gradient skips the update (parameters and optimizer state unchanged) and
    counts it in `skipped_updates`. `skip_by` says how (see SkipBy), `norm_by` how the gradient norm that
    decides it is reduced (see NormBy); either way a normal step updates the
    (donated) parameters and Adam moments in place. (Adam's step is bounded by about the learning rate
    per element, so finite gradients and a finite learning rate give finite parameters.)
    """
    tokens = jnp.maximum(sums["tokens"], 1.0)
    grad_norm = global_norm(grad_sums, norm_by) / tokens
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(sums["loss"])

    def update(state: TrainState) -> TrainState:
        # In the parameters' dtype: float32 `tokens` would promote bfloat16 gradients (model.param_dtype)
        # and so Adam's moments, which must keep the dtype they were created in.
        return state.apply_gradients(grads=jax.tree.map(lambda g: (g / tokens).astype(g.dtype), grad_sums))

    # Optax's count (and so the schedule) advances only on applied updates.
    if skip_by == "select":
        updated = update(state)
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        new_state = updated.replace(params=jax.tree.map(keep, updated.params, state.params),
                                    opt_state=jax.tree.map(keep, updated.opt_state, state.opt_state))
    else:
        new_state = jax.lax.cond(finite, update, lambda s: s.replace(step=s.step + 1), state)
    skipped = 1 - finite.astype(jnp.int32)
    consecutive = (state.consecutive_skipped + skipped) * skipped
    new_state = new_state.replace(
        skipped_updates=state.skipped_updates + skipped,
        consecutive_skipped=consecutive,
        longest_skip_streak=jnp.maximum(state.longest_skip_streak, consecutive),
    )
    metrics = {
        "loss": sums["loss"] / tokens,
        "nll": sums["nll"] / tokens,
        "accuracy": sums["correct"] / tokens,
        "tokens": sums["tokens"],
        "grad_norm": grad_norm,
        "update_skipped": skipped,
    }
    return new_state, metrics


def train_step(state: TrainState, batch: Batch, smoothing: float, projected: ProjectedLoss | None = None,
               skip_by: SkipBy = "cond", norm_by: NormBy = "leaves") -> tuple[TrainState, Metrics]:
    """One optimizer update on one batch (jit this with `donate_argnums=0`; `projected`: see loss_sums;
    `skip_by`, `norm_by`: see apply_gradients)."""
    grad_sums, sums = compute_gradients(state, batch, smoothing, projected=projected)
    return apply_gradients(state, grad_sums, sums, skip_by, norm_by)


def eval_step(params: Any, apply_fn: Callable, batch: Batch, smoothing: float) -> Metrics:
    """Loss, NLL, correct-token and token counts of each row of one batch ([rows] sums), without dropout.

    Summed over each row's tokens, not over the rows: the caller adds the rows up in a fixed order, so a split's
    totals are the same however its rows were spread over devices and processes (a cross-device sum adds in the
    order of its collective, which differs between one process of 4 devices and 2 of 2).
    """
    metrics = _token_metrics(_outputs(params, apply_fn, batch, None), batch["targets"], smoothing)
    return {key: value.sum(-1) for key, value in metrics.items()}


def add_trees(a: Any, b: Any) -> Any:
    """Elementwise a + b over matching pytrees (gradient accumulation)."""
    return jax.tree.map(jnp.add, a, b)
