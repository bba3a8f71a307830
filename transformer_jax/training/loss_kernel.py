"""The pre-softmax projection and the label-smoothed loss fused in Pallas TPU kernels: no logits in HBM.

`projected_cross_entropy_sums` (training/loss.py) forms each chunk's float32 logits with XLA, which writes them
to HBM and reads them back for the softmax and both gradient matmuls. These two kernels keep every block of
logits in the core's vector memory instead (as flash attention keeps its scores), with the output table as
both "keys" and "values":
  * `_statistics_kernel` (grid: token blocks x vocabulary blocks): the online logsumexp, the reference
    token's logit, the sum of the logits (label smoothing), the maximum, and softmax(logits) @ table, from which
    dloss/dhidden = softmax @ table - low * sum_v table_v - extra * table[reference];
  * `_table_gradient_kernel` (grid: vocabulary blocks x token blocks): the logits again, transposed, and
    dloss/dtable = (softmax - q)^T hidden, accumulated over the token blocks in float32.
Four [tokens, vocabulary, d_model] matmuls where XLA's chunks run three (the table gradient recomputes the
logits, as flash attention's backward pass does); HBM sees the hidden states, the table and the per-token
statistics, not the logits. Each call carries its FLOPs and bytes as a cost estimate, so XLA's cost analysis
counts the kernels' work. On other platforms the kernels run in Pallas' interpreter (the tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from transformer_jax.model.attention_kernels import kernel_device_kind
from transformer_jax.model.special_tokens import PAD_ID

TOKEN_BLOCK = 512  # tokens per block (sublanes): the statistics kernel reads the table once per block
VOCAB_BLOCK = 1024  # vocabulary entries per block (when none of VOCAB_BLOCKS divides the vocabulary: padded to it)
VOCAB_BLOCKS = range(2048, 255, -128)  # blocks that take a vocabulary unpadded (32,000: 1,280), largest first
# The blocks' working set in the core's vector memory (VMEM), and the limit the kernels ask for: TPU v2-v4 cores
# have 16 MiB of it (big's d_model of 1,024 at the largest blocks needs 23 MiB there), later chips 64 MiB or more.
SMALL_VMEM_KINDS = ("TPU v2", "TPU v3", "TPU v4")
LANES = 128  # the width of a TPU vector register: per-token statistics are kept one per lane row
KERNEL_NAMES = ("fused_loss_statistics", "fused_loss_table_gradient")  # as the compiled HLO names the two calls
VMEM_LIMIT = {"small": 16 * 2**20, "large": 48 * 2**20}
VMEM_BUDGET = {"small": 12 * 2**20, "large": 40 * 2**20}  # the blocks' estimated working set, under the limit
NEG_INF = -1e30  # a finite -inf, so that an all-masked block gives exp(0) * 0, never nan


def _statistics_kernel(hidden_ref, table_ref, targets_ref, stats_ref, soft_ref, max_sc, sum_sc, ref_sc, total_sc,
                       acc_sc, *, vocab: int, with_soft: bool):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _start():
        max_sc[...] = jnp.full(max_sc.shape, NEG_INF, jnp.float32)
        for scratch in (sum_sc, ref_sc, total_sc):
            scratch[...] = jnp.zeros(scratch.shape, jnp.float32)
        if with_soft:
            acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    table = table_ref[...]
    logits = jax.lax.dot_general(hidden_ref[...], table, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    ids = j * table.shape[0] + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    valid = ids < vocab
    logits = jnp.where(valid, logits, NEG_INF)
    max_prev = max_sc[:, :1]
    max_new = jnp.maximum(max_prev, logits.max(-1, keepdims=True))
    alpha = jnp.exp(max_prev - max_new)
    exp = jnp.where(valid, jnp.exp(logits - max_new), 0.0)
    sum_sc[...] = alpha * sum_sc[...] + exp.sum(-1, keepdims=True)
    max_sc[...] = jnp.broadcast_to(max_new, max_sc.shape)
    ref_sc[...] += jnp.where(ids == targets_ref[:, :1], logits, 0.0).sum(-1, keepdims=True)
    total_sc[...] += jnp.where(valid, logits, 0.0).sum(-1, keepdims=True)
    if with_soft:
        acc_sc[...] = alpha * acc_sc[...] + jnp.dot(exp.astype(table.dtype), table, preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        total = sum_sc[:, :1]
        lane = jax.lax.broadcasted_iota(jnp.int32, stats_ref.shape, 1)
        stats_ref[...] = jnp.where(lane == 0, max_sc[:, :1] + jnp.log(total), jnp.where(
            lane == 1, ref_sc[:, :1], jnp.where(lane == 2, total_sc[:, :1], max_sc[:, :1])))
        if with_soft:
            soft_ref[...] = acc_sc[...] / total


def _table_gradient_kernel(hidden_ref, table_ref, lse_ref, targets_ref, dtable_ref, *, vocab: int, extra: float,
                           low: float):
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _start():
        dtable_ref[...] = jnp.zeros(dtable_ref.shape, jnp.float32)

    hidden = hidden_ref[...]
    logits = jax.lax.dot_general(table_ref[...], hidden, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    ids = j * logits.shape[0] + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 0)
    targets = targets_ref[...]
    grad = jnp.exp(logits - lse_ref[...]) - low - jnp.where(ids == targets, extra, 0.0)
    grad = jnp.where((ids < vocab) & (targets != PAD_ID), grad, 0.0)
    dtable_ref[...] += jnp.dot(grad.astype(hidden.dtype), hidden, preferred_element_type=jnp.float32)


def vocab_block(vocab: int, largest: int = VOCAB_BLOCKS[0]) -> int:
    """Vocabulary entries per block, at most `largest`: the largest of VOCAB_BLOCKS that divides `vocab` (no padded
    copy of the table, no slice of its gradient), else VOCAB_BLOCK or `largest` (the vocabulary padded to it)."""
    return next((block for block in VOCAB_BLOCKS if block <= largest and vocab % block == 0),
                min(VOCAB_BLOCK, largest))


def _working_set(tokens: int, vocab: int, width: int, item: int) -> int:
    """Bytes of VMEM the blocks take, estimated: double-buffered hidden and table blocks and float32 outputs, the
    accumulator, and float32 [tokens, vocab] block intermediates (logits, exponentials, ids, gradient)."""
    return (2 * (tokens + vocab) * width * item + 3 * tokens * width * 4 + 4 * tokens * vocab * 4
            + 6 * tokens * LANES * 4)


def _vmem() -> str:
    """"small" for TPU cores with 16 MiB of VMEM (the chip compiled for), else "large"."""
    return "small" if kernel_device_kind().startswith(SMALL_VMEM_KINDS) else "large"


def blocks(vocab: int, width: int, item: int, vmem: str = "large") -> tuple[int, int]:
    """(tokens, vocabulary entries) per block: the largest whose working set fits the chip's VMEM budget."""
    for token_block in (TOKEN_BLOCK, TOKEN_BLOCK // 2, TOKEN_BLOCK // 4):
        for largest in (VOCAB_BLOCKS[0], 1024, 512, 256):
            block = vocab_block(vocab, largest)
            if _working_set(token_block, block, width, item) <= VMEM_BUDGET[vmem]:
                return token_block, block
    return TOKEN_BLOCK // 4, vocab_block(vocab, 256)


def _padded(x: jax.Array, axis: int, multiple: int, value: int = 0) -> jax.Array:
    pad = -x.shape[axis] % multiple
    return x if not pad else jnp.pad(x, [(0, pad if a == axis else 0) for a in range(x.ndim)], constant_values=value)


def logits_matmul_flops(tokens: int, vocab: int, width: int) -> int:
    """FLOPs of one [tokens, width] x [width, vocab] matmul. The kernels run four (the statistics kernel's logits and
    softmax @ table, the table-gradient kernel's logits again and its gradient), one more than the analytic count of
    the projection and its gradient: the recomputed logits, in place of reading them from HBM."""
    return 2 * tokens * vocab * width


def fused_projected_loss(hidden_NxD: jax.Array, table_VxD: jax.Array, targets_N: jax.Array, extra: float,
                         low: float, grads: bool, interpret: bool = False):
    """One device's per-token (lse, reference logit, sum of logits, max logit) and, with `grads`, the unscaled
    gradients of sum_n weight_n * loss_n: (dhidden [N, D] float32, dtable [V, D] float32).

    `hidden_NxD` and `table_VxD` are in the compute dtype; loss_n = lse_n - extra * reference_n - low * sum_n.
    """
    (tokens, width), vocab = hidden_NxD.shape, table_VxD.shape[0]
    vmem = _vmem()
    token_block, block = blocks(vocab, width, hidden_NxD.dtype.itemsize, vmem)
    hidden = _padded(hidden_NxD, 0, token_block)
    table = _padded(table_VxD, 0, block)
    targets = _padded(targets_N.astype(jnp.int32), 0, token_block, PAD_ID)
    (padded_tokens, _), padded_vocab = hidden.shape, table.shape[0]
    token_blocks, vocab_blocks = padded_tokens // token_block, padded_vocab // block
    item = hidden.dtype.itemsize
    matmul = logits_matmul_flops(padded_tokens, padded_vocab, width)
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=VMEM_LIMIT[vmem])
    lanes = jax.ShapeDtypeStruct((padded_tokens, LANES), jnp.float32)
    stats, soft = pl.pallas_call(
        functools.partial(_statistics_kernel, vocab=vocab, with_soft=grads),
        out_shape=(lanes, jax.ShapeDtypeStruct((padded_tokens, width) if grads else (8, LANES), jnp.float32)),
        grid=(token_blocks, vocab_blocks),
        in_specs=[pl.BlockSpec((token_block, width), lambda i, j: (i, 0)),
                  pl.BlockSpec((block, width), lambda i, j: (j, 0)),
                  pl.BlockSpec((token_block, LANES), lambda i, j: (i, 0))],
        out_specs=(pl.BlockSpec((token_block, LANES), lambda i, j: (i, 0)),
                   pl.BlockSpec((token_block, width), lambda i, j: (i, 0)) if grads
                   else pl.BlockSpec((8, LANES), lambda i, j: (0, 0))),
        scratch_shapes=[pltpu.VMEM((token_block, LANES), jnp.float32) for _ in range(4)]
        + [pltpu.VMEM((token_block, width) if grads else (8, LANES), jnp.float32)],
        compiler_params=params,
        cost_estimate=pl.CostEstimate(
            flops=matmul * (2 if grads else 1), transcendentals=padded_tokens * padded_vocab,
            bytes_accessed=token_blocks * padded_vocab * width * item + padded_tokens * (width * item + 3 * LANES * 4)
            + (padded_tokens * width * 4 if grads else 0)),
        interpret=interpret, name=KERNEL_NAMES[0],
    )(hidden, table, jnp.broadcast_to(targets[:, None], (padded_tokens, LANES)))
    lse, reference, total, maximum = (stats[:tokens, k] for k in range(4))
    if not grads:
        return (lse, reference, total, maximum), None
    dtable = pl.pallas_call(
        functools.partial(_table_gradient_kernel, vocab=vocab, extra=extra, low=low),
        out_shape=jax.ShapeDtypeStruct((padded_vocab, width), jnp.float32),
        grid=(vocab_blocks, token_blocks),
        in_specs=[pl.BlockSpec((token_block, width), lambda j, i: (i, 0)),
                  pl.BlockSpec((block, width), lambda j, i: (j, 0)),
                  pl.BlockSpec((1, token_block), lambda j, i: (0, i)),
                  pl.BlockSpec((1, token_block), lambda j, i: (0, i))],
        out_specs=pl.BlockSpec((block, width), lambda j, i: (j, 0)),
        compiler_params=params,
        cost_estimate=pl.CostEstimate(
            flops=2 * matmul, transcendentals=padded_tokens * padded_vocab,
            bytes_accessed=vocab_blocks * padded_tokens * (width * item + 8) + padded_vocab * width * (item + 4)),
        interpret=interpret, name=KERNEL_NAMES[1],
    )(hidden, table, stats[:, :1].reshape(1, padded_tokens), targets[None, :])
    dtable = dtable if padded_vocab == vocab else dtable[:vocab]
    weights = (targets_N != PAD_ID).astype(jnp.float32)[:, None]
    reference_rows = jnp.take(table_VxD, targets_N, axis=0).astype(jnp.float32)
    table_sum = table_VxD.astype(jnp.float32).sum(0)
    dhidden = weights * (soft[:tokens] - low * table_sum - extra * reference_rows)
    return (lse, reference, total, maximum), (dhidden, dtable)
