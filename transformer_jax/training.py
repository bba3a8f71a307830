"""Training: the paper's loss, learning-rate schedule and Adam, the train state, and the jitted steps.

Batches are dicts of int32 arrays: `inputs` [B, S], `targets` [B, T], `target_inputs` [B, T] (BOS +
targets shifted right) and, for packed rows, `inputs_position`, `targets_position`,
`inputs_segmentation`, `targets_segmentation`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from transformer_jax.masks import PAD_ID
from transformer_jax.model import Transformer

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


def label_smoothed_cross_entropy(
    logits_BxTxV: jax.Array, targets_BxT: jax.Array, smoothing: float
) -> tuple[jax.Array, jax.Array]:
    """Per-token cross-entropy against the smoothed target distribution, and the plain NLL.

    The smoothed distribution q puts 1 - smoothing on the reference token and smoothing / (V - 1) on
    every other token (as tensor2tensor and fairseq do). Neither q (a one-hot) nor log-probabilities
    are materialized as [B, T, V] arrays: with lse = logsumexp(logits),
      -sum_v q_v log p_v = lse - (conf - low) * logit_ref - low * sum_v logit_v,
    and the gradient, softmax - q, is formed in the backward pass from exp(logits - max), computed once
    in the forward pass (for the logsumexp) and kept in place of the logits: the one float32 [B, T, V]
    array kept for the backward pass, and no second exponential pass over it.
    """
    return _smoothed_cross_entropy(logits_BxTxV.astype(jnp.float32), targets_BxT, float(smoothing))


def _smoothing_weights(vocab_size: int, smoothing: float) -> tuple[float, float]:
    """(conf - low, low): the reference token's extra weight and every token's base weight in q."""
    low = smoothing / (vocab_size - 1) if smoothing else 0.0
    return 1.0 - smoothing - low, low


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _smoothed_cross_entropy(
    logits_BxTxV: jax.Array, targets_BxT: jax.Array, smoothing: float
) -> tuple[jax.Array, jax.Array]:
    loss_and_nll, _ = _smoothed_cross_entropy_forward(logits_BxTxV, targets_BxT, smoothing)
    return loss_and_nll


def _smoothed_cross_entropy_forward(
    logits_BxTxV: jax.Array, targets_BxT: jax.Array, smoothing: float
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    extra, low = _smoothing_weights(logits_BxTxV.shape[-1], smoothing)
    max_BxT = jnp.max(logits_BxTxV, axis=-1)
    # exp(logits - max) is kept for the backward pass in place of the logits (same size; the logits
    # die here), so softmax = exp / sum needs no second exponential pass over [B, T, V].
    exp_BxTxV = jnp.exp(logits_BxTxV - max_BxT[..., None])
    sum_BxT = exp_BxTxV.sum(-1)
    lse_BxT = max_BxT + jnp.log(sum_BxT)
    reference_BxT = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], -1)[..., 0]
    nll_BxT = lse_BxT - reference_BxT
    loss_BxT = lse_BxT - extra * reference_BxT
    if low:
        loss_BxT = loss_BxT - low * logits_BxTxV.sum(-1)
    return (loss_BxT, nll_BxT), (exp_BxTxV, targets_BxT, sum_BxT)


def _smoothed_cross_entropy_backward(
    smoothing: float, residuals: tuple[jax.Array, jax.Array, jax.Array], cotangents: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, None]:
    exp_BxTxV, targets_BxT, sum_BxT = residuals
    g_loss_BxT, g_nll_BxT = cotangents
    extra, low = _smoothing_weights(exp_BxTxV.shape[-1], smoothing)
    # d loss / d logits = softmax - q; d nll / d logits = softmax - onehot (both sum over the cotangents).
    is_ref_BxTxV = jnp.arange(exp_BxTxV.shape[-1], dtype=targets_BxT.dtype) == targets_BxT[..., None]
    g_ref_BxT = extra * g_loss_BxT + g_nll_BxT
    grad_BxTxV = (
        ((g_loss_BxT + g_nll_BxT) / sum_BxT)[..., None] * exp_BxTxV
        - low * g_loss_BxT[..., None]
        - jnp.where(is_ref_BxTxV, g_ref_BxT[..., None], 0.0)
    )
    return grad_BxTxV, None


_smoothed_cross_entropy.defvjp(_smoothed_cross_entropy_forward, _smoothed_cross_entropy_backward)


def paper_learning_rate(
    d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> Callable[[jax.Array], jax.Array]:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

    Returned as an optax schedule of the update count (which optax counts from 0).
    """

    def schedule(count: jax.Array) -> jax.Array:
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def paper_optimizer(
    schedule: Callable[[jax.Array], jax.Array],
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    grad_clip_norm: float | None = None,
) -> optax.GradientTransformation:
    """Adam(β1=0.9, β2=0.98, ε=1e-9) with the given schedule, optionally after global-norm clipping."""
    adam = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    if grad_clip_norm:
        return optax.chain(optax.clip_by_global_norm(grad_clip_norm), adam)
    return adam


class TrainState(train_state.TrainState):
    """Parameters, optimizer state and step, the dropout key, and counts of skipped updates."""

    dropout_key: jax.Array = struct.field(default=None)
    skipped_updates: jax.Array = struct.field(default=None)  # in the whole run
    consecutive_skipped: jax.Array = struct.field(default=None)  # since the last finite update
    longest_skip_streak: jax.Array = struct.field(default=None)  # most consecutive skips so far


def create_train_state(
    model: Transformer, optimizer: optax.GradientTransformation, seed: int
) -> TrainState:
    """Initialize parameters (with logical-axis boxes) and the optimizer state from `seed`.

    Pass the same `model` and `optimizer` objects to every call whose results must share a tree
    structure (e.g. `jax.eval_shape` and `jax.jit` of the same initializer).
    """
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    dummy = jnp.ones((1, 8), jnp.int32)
    params = model.init(init_key, dummy, dummy)["params"]
    return TrainState.create(
        apply_fn=model.apply,
        params=params,
        tx=optimizer,
        dropout_key=jax.random.key_data(dropout_key),
        skipped_updates=jnp.zeros((), jnp.int32),
        consecutive_skipped=jnp.zeros((), jnp.int32),
        longest_skip_streak=jnp.zeros((), jnp.int32),
    )


def _model_inputs(batch: Batch) -> dict[str, jax.Array | None]:
    return dict(
        src_positions=batch.get("inputs_position"),
        tgt_positions=batch.get("targets_position"),
        src_segments=batch.get("inputs_segmentation"),
        tgt_segments=batch.get("targets_segmentation"),
    )


def loss_sums(
    params: Any, apply_fn: Callable, batch: Batch, smoothing: float, dropout_key: jax.Array | None
) -> tuple[jax.Array, Metrics]:
    """Summed label-smoothed loss over non-pad target tokens, and summed metrics (not yet averaged)."""
    deterministic = dropout_key is None
    rngs = None if deterministic else {"dropout": dropout_key}
    logits_BxTxV = apply_fn(
        {"params": params}, batch["inputs"], batch["target_inputs"], **_model_inputs(batch),
        deterministic=deterministic, rngs=rngs,
    )
    loss_BxT, nll_BxT = label_smoothed_cross_entropy(logits_BxTxV, batch["targets"], smoothing)
    weights_BxT = (batch["targets"] != PAD_ID).astype(jnp.float32)
    # "Correct" = the reference has the highest logit (ties count as correct). A max is one vectorized
    # pass over the logits; XLA's argmax (a variadic reduce) is several times slower on CPU.
    logits_BxTxV = jax.lax.stop_gradient(logits_BxTxV)
    reference_BxT = jnp.take_along_axis(logits_BxTxV, batch["targets"][..., None], -1)[..., 0]
    correct_BxT = (reference_BxT >= logits_BxTxV.max(-1)).astype(jnp.float32)
    sums = {
        "loss": (loss_BxT * weights_BxT).sum(),
        "nll": (nll_BxT * weights_BxT).sum(),
        "correct": (correct_BxT * weights_BxT).sum(),
        "tokens": weights_BxT.sum(),
    }
    return sums["loss"], sums


def step_dropout_key(state: TrainState) -> jax.Array:
    """The dropout key of this step: derived from the seed and the step, so reruns repeat exactly."""
    return jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)


def compute_gradients(
    state: TrainState, batch: Batch, smoothing: float, micro_step: int | jax.Array = 0
) -> tuple[Any, Metrics]:
    """Gradients of the summed loss of one (micro-)batch, and its summed metrics."""
    dropout_key = jax.random.fold_in(step_dropout_key(state), micro_step)
    grad_fn = jax.grad(loss_sums, has_aux=True)
    return grad_fn(state.params, state.apply_fn, batch, smoothing, dropout_key)


def apply_gradients(state: TrainState, grad_sums: Any, sums: Metrics) -> tuple[TrainState, Metrics]:
    """Normalize summed gradients by the batch's non-pad target tokens and take one Adam step.

    A non-finite loss or gradient skips the update (parameters and optimizer state unchanged) and
    counts it in `skipped_updates`. The decision is taken before the update, under `lax.cond`, so a
    normal step updates the (donated) parameters and Adam moments in place: no second copy of the
    state, no extra pass over it. (Adam's step is bounded by about the learning rate per element, so
    finite gradients and a finite learning rate give finite parameters.)
    """
    tokens = jnp.maximum(sums["tokens"], 1.0)
    grad_norm = optax.tree.norm(grad_sums) / tokens
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(sums["loss"])

    def update(state: TrainState) -> TrainState:
        return state.apply_gradients(grads=jax.tree.map(lambda g: g / tokens, grad_sums))

    # Optax's count (and so the schedule) advances only on applied updates.
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


def train_step(state: TrainState, batch: Batch, smoothing: float) -> tuple[TrainState, Metrics]:
    """One optimizer update on one batch (jit this with `donate_argnums=0`)."""
    grad_sums, sums = compute_gradients(state, batch, smoothing)
    return apply_gradients(state, grad_sums, sums)


def eval_step(params: Any, apply_fn: Callable, batch: Batch, smoothing: float) -> Metrics:
    """Summed loss, NLL, correct-token and token counts of one batch, without dropout."""
    _, sums = loss_sums(params, apply_fn, batch, smoothing, None)
    return sums


def add_trees(a: Any, b: Any) -> Any:
    """Elementwise a + b over matching pytrees (gradient accumulation)."""
    return jax.tree.map(jnp.add, a, b)

