"""The label-smoothed cross-entropy of the paper (section 5.4), with a hand-written backward pass.

`label_smoothed_cross_entropy` takes the logits; `projected_cross_entropy_sums` takes the decoder's last
hidden states and the output table and never forms the whole batch's logits (accelerators).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from transformer_jax.base.sharding import BATCH_AXES, mesh_platform
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import PAD_ID
from transformer_jax.model.transformer import output_weights


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


def projected_cross_entropy_sums(
    hidden_BxTxD: jax.Array, table_VxD: jax.Array, targets_BxT: jax.Array, smoothing: float, *,
    bias_V: jax.Array | None = None, dtype: Any = jnp.float32, chunk_tokens: int = 2048, mesh: Mesh | None = None,
    kernel: bool = False,
) -> dict[str, jax.Array]:
    """The pre-softmax projection and the label-smoothed loss together, a chunk of tokens at a time.

    The same sums as `label_smoothed_cross_entropy` over `hidden @ table^T (+ bias)` weighted by the
    non-padding targets ("loss", "nll", "correct": the reference has the highest logit, "tokens"), but no
    float32 [B, T, V] array exists: each chunk of at most `chunk_tokens` tokens (per device) forms its
    logits, its sums and, at once, its share of the gradient, dloss/dhidden = (softmax - q) table and
    dloss/dtable = (softmax - q)^T hidden (accumulated in float32 over the chunks, so the gradient of a
    shared embedding is the whole batch's), then drops them. The matmuls run in `dtype` with float32
    accumulation, as `TokenEmbedding.attend` does; the gradients are kept from the forward pass and scaled
    by the cotangent in the backward pass, so the backward pass has no matmul of its own: the FLOPs of the
    unchunked projection, forward and backward.

    `table_VxD` is the tied embedding table (or an untied projection's kernel, transposed) in its
    parameter dtype; its gradient comes back in that dtype. On a `mesh`, each device works on its own
    rows (the batch is split over `base.sharding.BATCH_AXES`) and the sums and the table's gradient are
    summed over the devices once, after the last chunk. Only "loss" is differentiable.

    `kernel` (no `bias_V`): the fused Pallas kernels of training/loss_kernel.py in place of XLA's chunks, which
    keep no logits in HBM at all (TPUs; elsewhere Pallas' interpreter); `chunk_tokens` is then unused.
    """
    if kernel and bias_V is not None:
        raise ValueError("the fused loss kernel has no output bias: pass kernel=False for a model with one")
    loss, nll, correct = _projected_loss(hidden_BxTxD, table_VxD, bias_V, targets_BxT, float(smoothing),
                                         jnp.dtype(dtype), int(chunk_tokens), mesh, bool(kernel))
    weights = (targets_BxT != PAD_ID).astype(jnp.float32)
    return {"loss": loss, "nll": jax.lax.stop_gradient(nll), "correct": jax.lax.stop_gradient(correct),
            "tokens": weights.sum()}


@dataclasses.dataclass(frozen=True)
class ProjectedLoss:
    """How a train step forms its loss from the decoder's last hidden states (`projected_cross_entropy_sums`):
    the model whose output weights it reads, at most `chunk_tokens` tokens per device at a time, on `mesh`."""

    model: TransformerConfig
    chunk_tokens: int
    mesh: Mesh | None = None
    kernel: bool = False

    def sums(self, params: Any, hidden_BxTxD: jax.Array, targets_BxT: jax.Array, smoothing: float
             ) -> dict[str, jax.Array]:
        """The loss sums of `hidden_BxTxD` (from `Transformer(..., hidden_only=True)`) under `params`."""
        table_VxD, bias_V = output_weights(params, self.model)
        return projected_cross_entropy_sums(hidden_BxTxD, table_VxD, targets_BxT, smoothing, bias_V=bias_V,
                                            dtype=self.model.compute_dtype, chunk_tokens=self.chunk_tokens,
                                            mesh=self.mesh, kernel=self.kernel)


# Tokens per device whose logits a TPU forms at once (training.loss_chunk_tokens=-1): with a 37k
# vocabulary, 151 MB of float32 logits per chunk (BENCHMARKS.md, "Accelerators").
ACCELERATOR_CHUNK_TOKENS = 1024
# Float32 logits a GPU forms at once (training.loss_chunk_tokens=-1): a chunk of 1,024 tokens is a dozen kernels
# and one more pass over the table's float32 gradient (XLA:GPU does not fuse the accumulation into the matmul), so
# the paper's batch in 1,024-token chunks was 292 kernels and 2.4 GB of HBM traffic more than in one chunk (base,
# 8k vocabulary, H100 program; docs/benchmarks/accelerators.md). 1 GiB: the whole batch at 8k pieces, 4 chunks at 37k.
GPU_CHUNK_LOGITS_BYTES = 2**30


def accelerator_chunk_tokens(platform: str, vocab_size: int) -> int:
    """Tokens per device the projected loss forms logits for at once on `platform` ("tpu", "gpu") by default."""
    if platform == "gpu":
        return max(ACCELERATOR_CHUNK_TOKENS, GPU_CHUNK_LOGITS_BYTES // (4 * vocab_size))
    return ACCELERATOR_CHUNK_TOKENS


def projected_loss_for(chunk_tokens: int, model: TransformerConfig, mesh: Mesh, kernel: str = "auto"
                       ) -> ProjectedLoss | None:
    """The loss a run's train step uses (training.loss_chunk_tokens, training.loss_kernel): None for the whole
    batch's logits (0, and -1 on CPUs, where that path is as fast and keeps earlier runs' numbers), else the
    projected loss: by the fused Pallas kernels ("pallas"; "auto" on TPUs for a model without an output bias) or
    in chunks of that many tokens per device (-1: accelerator_chunk_tokens, by the platform and vocabulary)."""
    platform = mesh_platform(mesh)
    if chunk_tokens < 0:
        chunk_tokens = (0 if platform == "cpu" and kernel != "pallas"
                        else accelerator_chunk_tokens(platform, model.vocab_size))
    bias = model.output_bias or not model.tie_output_embedding
    fused = kernel == "pallas" or (kernel == "auto" and platform == "tpu" and not bias)
    return ProjectedLoss(model, chunk_tokens, mesh, fused) if chunk_tokens else None


def _chunks(tokens: int, chunk_tokens: int) -> int:
    """The fewest chunks of at most `chunk_tokens` that split `tokens` evenly."""
    chunks = max(1, -(-tokens // max(1, chunk_tokens)))
    while tokens % chunks:
        chunks += 1
    return chunks


def _local_projected_loss(hidden_BxTxD, table_VxD, bias_V, targets_BxT, smoothing, dtype, chunk_tokens, grads,
                          kernel=False):
    """One device's sums and, with `grads`, gradients: ((loss, nll, correct), (dhidden, dtable, dbias)), unscaled.

    `kernel`: the fused Pallas kernels (training/loss_kernel.py; no output bias) in place of XLA's chunks."""
    vocab, width = table_VxD.shape
    extra, low = _smoothing_weights(vocab, smoothing)
    if kernel:
        return _kernel_projected_loss(hidden_BxTxD, table_VxD, targets_BxT, extra, low, dtype, grads)
    chunks = _chunks(targets_BxT.size, chunk_tokens)
    hidden_CxNxD = hidden_BxTxD.reshape(chunks, -1, width).astype(dtype)
    targets_CxN = targets_BxT.reshape(chunks, -1)
    table = table_VxD.astype(dtype)
    vocab_ids = jnp.arange(vocab, dtype=targets_BxT.dtype)
    # Label smoothing's sum of a token's logits is hidden . (the table's column sums) (+ the bias' sum): a matrix-vector
    # product instead of another pass over the chunk's float32 [N, V] logits (on a GPU each pass is a kernel
    # reading all of them; the reference logit is gathered, not summed out of them, for the same reason).
    table_sum_D = table.astype(jnp.float32).sum(0)
    bias_sum = 0.0 if bias_V is None else bias_V.astype(jnp.float32).sum()

    def chunk(carry, inputs):
        sums, dtable_VxD, dbias_V = carry
        hidden_NxD, targets_N = inputs
        logits_NxV = jnp.einsum("nd,vd->nv", hidden_NxD, table, preferred_element_type=jnp.float32)
        if bias_V is not None:
            logits_NxV = logits_NxV + bias_V.astype(jnp.float32)
        max_N = logits_NxV.max(-1)
        exp_NxV = jnp.exp(logits_NxV - max_N[:, None])
        sum_N = exp_NxV.sum(-1)
        lse_N = max_N + jnp.log(sum_N)
        is_ref_NxV = vocab_ids == targets_N[:, None]
        reference_N = jnp.take_along_axis(logits_NxV, targets_N[:, None], -1)[:, 0]
        weights_N = (targets_N != PAD_ID).astype(jnp.float32)
        if low:
            total_N = jnp.dot(hidden_NxD.astype(jnp.float32), table_sum_D, precision=jax.lax.Precision.HIGHEST)
            loss_N = lse_N - extra * reference_N - low * (total_N + bias_sum)
        else:
            loss_N = lse_N - extra * reference_N
        sums = sums + jnp.stack([(loss_N * weights_N).sum(), ((lse_N - reference_N) * weights_N).sum(),
                                 ((reference_N >= max_N) * weights_N).sum()])
        if not grads:
            return (sums, dtable_VxD, dbias_V), None
        # d loss / d logits = softmax - q, q = low everywhere plus `extra` on the reference; pads weigh 0.
        grad_NxV = (exp_NxV / sum_N[:, None] - low - jnp.where(is_ref_NxV, extra, 0.0)) * weights_N[:, None]
        if bias_V is not None:
            dbias_V = dbias_V + grad_NxV.sum(0)
        grad_NxV = grad_NxV.astype(dtype)
        dhidden_NxD = jnp.einsum("nv,vd->nd", grad_NxV, table, preferred_element_type=jnp.float32)
        dtable_VxD = dtable_VxD + jnp.einsum("nv,nd->vd", grad_NxV, hidden_NxD, preferred_element_type=jnp.float32)
        return (sums, dtable_VxD, dbias_V), dhidden_NxD.astype(hidden_BxTxD.dtype)

    start = (jnp.zeros(3, jnp.float32), jnp.zeros((vocab, width), jnp.float32) if grads else None,
             None if bias_V is None or not grads else jnp.zeros((vocab,), jnp.float32))
    # A Python loop, each chunk's inputs tied to the previous chunk's results by an optimization barrier: XLA
    # then holds one chunk's logits at a time (as a loop would) yet sees every chunk, so its cost analysis
    # counts all their FLOPs and bytes (it counts a loop's body once).
    carry, outputs = start, []
    for index in range(chunks):
        if index:
            carry, hidden_NxD = jax.lax.optimization_barrier((carry, hidden_CxNxD[index]))
        else:
            hidden_NxD = hidden_CxNxD[index]
        carry, dhidden_NxD = chunk(carry, (hidden_NxD, targets_CxN[index]))
        outputs.append(dhidden_NxD)
    sums, dtable_VxD, dbias_V = carry
    dhidden_CxNxD = None if not grads else jnp.stack(outputs)
    if not grads:
        return tuple(sums), (None, None, None)
    return tuple(sums), (dhidden_CxNxD.reshape(hidden_BxTxD.shape), dtable_VxD, dbias_V)


def _kernel_projected_loss(hidden_BxTxD, table_VxD, targets_BxT, extra, low, dtype, grads):
    """`_local_projected_loss` by the fused kernels: the same sums and unscaled gradients."""
    from transformer_jax.model.attention_kernels import kernel_platform
    from transformer_jax.training.loss_kernel import fused_projected_loss

    width = table_VxD.shape[1]
    targets_N = targets_BxT.reshape(-1)
    (lse_N, reference_N, total_N, max_N), gradients = fused_projected_loss(
        hidden_BxTxD.reshape(-1, width).astype(dtype), table_VxD.astype(dtype), targets_N, extra, low, grads,
        interpret=kernel_platform() != "tpu")
    weights_N = (targets_N != PAD_ID).astype(jnp.float32)
    loss_N = lse_N - extra * reference_N - low * total_N
    sums = ((loss_N * weights_N).sum(), ((lse_N - reference_N) * weights_N).sum(),
            ((reference_N >= max_N) * weights_N).sum())
    if not grads:
        return sums, (None, None, None)
    dhidden_NxD, dtable_VxD = gradients
    return sums, (dhidden_NxD.reshape(hidden_BxTxD.shape).astype(hidden_BxTxD.dtype), dtable_VxD, None)


def _projected_loss_forward(hidden_BxTxD, table_VxD, bias_V, targets_BxT, smoothing, dtype, chunk_tokens, mesh,
                            kernel, grads=True):
    local = functools.partial(_local_projected_loss, smoothing=smoothing, dtype=dtype, chunk_tokens=chunk_tokens,
                              grads=grads, kernel=kernel)
    if mesh is None or mesh.size == 1:
        sums, (dhidden, dtable, dbias) = local(hidden_BxTxD, table_VxD, bias_V, targets_BxT)
    else:
        def per_device(hidden, table, bias, targets):
            sums, (dhidden, dtable, dbias) = local(hidden, table, bias, targets)
            return jax.lax.psum((sums, dtable, dbias), BATCH_AXES), dhidden

        rows, whole = PartitionSpec(BATCH_AXES), PartitionSpec()
        (sums, dtable, dbias), dhidden = jax.shard_map(
            per_device, mesh=mesh, in_specs=(rows, whole, whole, rows), out_specs=((whole, whole, whole), rows),
            check_vma=False,
        )(hidden_BxTxD, table_VxD, bias_V, targets_BxT)
    if not grads:
        return sums, None
    return sums, (dhidden, dtable.astype(table_VxD.dtype), None if dbias is None else dbias.astype(bias_V.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _projected_loss(hidden_BxTxD, table_VxD, bias_V, targets_BxT, smoothing, dtype, chunk_tokens, mesh, kernel):
    return _projected_loss_forward(hidden_BxTxD, table_VxD, bias_V, targets_BxT, smoothing, dtype, chunk_tokens,
                                   mesh, kernel, grads=False)[0]


def _projected_loss_backward(smoothing, dtype, chunk_tokens, mesh, kernel, grads, cotangents):
    dhidden, dtable, dbias = grads
    g_loss = cotangents[0]  # nll and correct are not differentiable (stop_gradient above)
    scale = lambda x: None if x is None else (x * g_loss).astype(x.dtype)  # noqa: E731
    return scale(dhidden), scale(dtable), scale(dbias), None


_projected_loss.defvjp(_projected_loss_forward, _projected_loss_backward)
