"""The label-smoothed cross-entropy of the paper (section 5.4), with a hand-written backward pass."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


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
