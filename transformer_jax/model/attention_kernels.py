"""Attention kernels for accelerators: the scores never reach device memory.

On TPUs, JAX's Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) computes
softmax(QK^T / sqrt(d_k))V a block of queries and keys at a time in the core's vector memory, with the
masks given by segment ids (packed rows and padding) and a causal flag, forward and backward. On NVIDIA GPUs
the same role is played by cuDNN's flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`,
model/attention.py). `attention_backend="auto"` picks by the platform the program is compiled for: the mesh
set with `jax.set_mesh` while tracing (the run builder sets the run's mesh: run/programs.py), else JAX's
default backend. On GPUs "auto" picks a kernel only once it is proven finite there, forward and backward, in
training (`GPU_AUTO_BACKEND`).

A query whose keys are all masked (a padding position of a packed row, a row of padding) never reaches a fused
kernel as such (`kernel_mask`): it attends to every key, and its output is zeroed after the kernel. Given to
cuDNN's flash attention as it is, the row's softmax statistics are those of JAX's mask bias alone (-2^41 in
bfloat16), and its backward pass, which recomputes exp(score - logsumexp) tile by tile, overflows to inf where
any term is not masked exactly as in the forward pass (the padded half of a 128-key tile at widths of 64 mod
128, as GPU rows are); inf times the row's zero output gradient is NaN, which reaches dQ, dK and dV and through
them every parameter.

Splash attention is a custom kernel XLA cannot split over devices, so on a mesh it runs under `shard_map`,
each device on its own rows (the batch split over every mesh axis, as `base.sharding.batch_sharding`
does). Without a mesh it is used only where there is one device: a kernel called on arrays XLA has spread
over devices would gather them first.

Neither kernel applies attention dropout (not in the paper; model.attention_dropout_rate=0 by default):
with attention dropout, "auto" is XLA's einsum attention.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from transformer_jax.model.masks import causal_mask, combine_masks, padding_mask, segment_mask
from transformer_jax.model.special_tokens import PAD_ID

# What "auto" is on GPUs (16-bit compute, no attention dropout): XLA's fused attention, which trained a base model
# end to end in bfloat16 on an H200 with finite gradients. cuDNN's flash attention ("cudnn") becomes the choice
# once test_cudnn_gives_the_einsum_loss_and_gradients_on_a_gpu (tests/model/test_attention_kernels.py, run by
# benchmarks/lease/on_gpu.sh) passes on a GPU and a run trains with it: then set "cudnn" here.
GPU_AUTO_BACKEND = "fused"

# XLA records cuDNN's fused attention into its CUDA-graph command buffers when the command-buffer types
# (DebugOptions.CommandBufferCmdType, flag --xla_gpu_enable_command_buffer) include CUDNN, as XLA's default list
# does (FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN, DYNAMIC_SLICE_FUSION). Capturing the train step's cuDNN
# attention failed on an H200 ("cuda_graph_end_capture ... capturing stream has unjoined work", cuda_dnn.cc), so a
# run whose attention may be cuDNN's takes CUDNN out of the list and keeps the rest ("-CUDNN": XLA's incremental
# form, applied to the default list of the XLA version installed).
COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer"
WITHOUT_CUDNN_COMMANDS = "-CUDNN"

# Splash attention works on blocks of 128 queries and keys (the TPU's lanes): rows whose lengths are not
# multiples of it use XLA's attention.
SPLASH_BLOCK = 128
# The largest block of queries or keys a kernel call takes at once (rows of 256 tokens: one block each).
SPLASH_MAX_BLOCK = 512


@flax.struct.dataclass
class SegmentedMask:
    """A mask given by segment ids rather than a [B, 1, T, S] array: query t may attend to key s when both
    have the same segment id, neither is padding (id 0) and, if `causal`, s <= t. What a kernel takes; the
    einsum path uses `dense()`, the same mask as padding_mask & segment_mask (& causal_mask)."""

    q_segments: jax.Array  # [B, T] int, 0 = padding
    kv_segments: jax.Array  # [B, S]
    causal: bool = flax.struct.field(pytree_node=False, default=False)

    @classmethod
    def of(cls, q_tokens: jax.Array, kv_tokens: jax.Array, q_segments: jax.Array | None,
           kv_segments: jax.Array | None, causal: bool = False) -> "SegmentedMask":
        """From token ids (0 = padding) and packed rows' segment ids (None: one segment per row)."""
        def ids(tokens: jax.Array, segments: jax.Array | None) -> jax.Array:
            present = (tokens != PAD_ID).astype(jnp.int32)
            return present if segments is None else jnp.where(tokens != PAD_ID, segments.astype(jnp.int32), 0)
        return cls(ids(q_tokens, q_segments), ids(kv_tokens, kv_segments), causal)

    def dense(self) -> jax.Array:
        """The boolean [B, 1, T, S] mask."""
        q, kv = self.q_segments, self.kv_segments
        return combine_masks(padding_mask(q, kv), segment_mask(q, kv),
                             causal_mask(q.shape[1]) if self.causal else None)


def kernel_platform() -> str:
    """The platform attention is compiled for: the context mesh's (jax.set_mesh), else JAX's default backend."""
    device = _context_device()
    return device.platform if device is not None else jax.default_backend()


def kernel_device_kind() -> str:
    """The kind of chip kernels are compiled for ("TPU v5 lite", "cpu", ...): the context mesh's, else the first
    device's."""
    device = _context_device()
    return device.device_kind if device is not None else jax.devices()[0].device_kind


def _context_device() -> Any:
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.abstract_device if not mesh.empty else None


def resolve_backend(backend: str, attention_dropout_rate: float, dtype: Any = jnp.bfloat16) -> str:
    """What "auto" is on this platform: "splash" on TPUs, `GPU_AUTO_BACKEND` on GPUs for 16-bit compute (cuDNN's
    flash attention takes no float32; "cudnn" only where cuDNN is installed, else "fused"), else "einsum";
    "einsum" wherever attention dropout is on. Other backends are returned as they are."""
    if backend != "auto":
        return backend
    if attention_dropout_rate > 0:
        return "einsum"
    platform = kernel_platform()
    if platform == "tpu":
        return "splash"
    if platform == "gpu" and jnp.dtype(dtype).itemsize == 2:
        return "fused" if GPU_AUTO_BACKEND == "cudnn" and not cudnn_available() else GPU_AUTO_BACKEND
    return "einsum"


def may_run_cudnn(backend: str, attention_dropout_rate: float, dtype: Any) -> bool:
    """Whether attention with these settings runs cuDNN's kernel on a GPU: "cudnn", or "auto" where it picks cuDNN
    there. Decided without starting JAX's backends (the answer sets XLA's flags, which must come before)."""
    if backend == "auto":
        return GPU_AUTO_BACKEND == "cudnn" and attention_dropout_rate == 0 and jnp.dtype(dtype).itemsize == 2
    return backend == "cudnn"


def command_buffer_flags(xla_flags: str, backend: str, attention_dropout_rate: float, dtype: Any) -> str:
    """`xla_flags` (XLA_FLAGS' value) with cuDNN's kernels kept out of XLA's command buffers where attention may run
    cuDNN's (see WITHOUT_CUDNN_COMMANDS); unchanged otherwise, and where the flag is already set (the user's
    choice). Only GPUs read the flag."""
    if not may_run_cudnn(backend, attention_dropout_rate, dtype):
        return xla_flags
    if any(flag.split("=", 1)[0] == COMMAND_BUFFER_FLAG for flag in xla_flags.split()):
        return xla_flags
    return " ".join(filter(None, [xla_flags.strip(), f"{COMMAND_BUFFER_FLAG}={WITHOUT_CUDNN_COMMANDS}"]))


def kernel_mask(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The boolean mask a fused kernel is given, every query with at least one key, and which queries have one.

    A query whose keys are all masked attends to every key instead (ordinary softmax statistics: see the module
    docstring); the caller zeroes its output, so its output gradient is zero and it adds nothing to any gradient.
    Returns (mask | no key, has a key), the latter [..., T, 1] as `mask` is [..., T, S].
    """
    has_key = jnp.any(mask, axis=-1, keepdims=True)
    return mask | ~has_key, has_key


@functools.lru_cache(maxsize=1)
def cudnn_available() -> bool:
    """Whether JAX finds cuDNN on this host: its attention checks the library's version while tracing, so a
    host that compiles for GPUs without their libraries (the preflight's compile-only H100) uses XLA's."""
    try:
        from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version

        check_cudnn_version()
    except Exception:  # noqa: BLE001 - any failure to find or load cuDNN means: not here
        return False
    return True


def splash_applies(q_len: int, kv_len: int) -> bool:
    """Whether splash attention takes rows of these lengths (whole blocks of SPLASH_BLOCK), and there is a
    mesh to place it on or a single device."""
    lengths = q_len % SPLASH_BLOCK == 0 and kv_len % SPLASH_BLOCK == 0
    return lengths and (not jax.sharding.get_abstract_mesh().empty or jax.device_count() == 1)


def splash_attention(q_BxTxHxK: jax.Array, k_BxSxHxK: jax.Array, v_BxSxHxK: jax.Array, mask: SegmentedMask
                     ) -> jax.Array:
    """softmax(QK^T / sqrt(d_k) where `mask` allows)V per head by TPU splash attention, [B, T, H, K].

    A query with no allowed key (padding, or a packed segment absent from the keys) gets finite values
    that mean nothing, where the einsum path gives zeros: such positions carry no loss. Off TPUs the kernel
    runs in Pallas' interpreter (tests).
    """
    rows = functools.partial(_splash_rows, causal=mask.causal, interpret=kernel_platform() != "tpu")
    mesh = jax.sharding.get_abstract_mesh()
    # Inside a shard_map (the search: each device its own rows) the manual axes are already split.
    free = () if mesh.empty else tuple(axis for axis in mesh.axis_names if axis not in mesh.manual_axes)
    if not free or mesh.size == 1:
        return rows(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask.q_segments, mask.kv_segments)
    split = PartitionSpec(free)
    return jax.shard_map(rows, in_specs=(split,) * 5, out_specs=split, check_vma=False)(
        q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask.q_segments, mask.kv_segments)


def _block(length: int) -> int:
    """The largest block of at most SPLASH_MAX_BLOCK that splits `length` (a multiple of SPLASH_BLOCK)."""
    return next(size for size in (SPLASH_MAX_BLOCK, 256, SPLASH_BLOCK) if length % size == 0)


def _splash_rows(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_segments_BxT, kv_segments_BxS, *, causal, interpret):
    """One device's rows through the splash kernel (a per-row kernel, mapped over the rows)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    _, q_len, heads, head_dim = q_BxTxHxK.shape
    kv_len = k_BxSxHxK.shape[1]
    head_mask = masks.CausalMask((q_len, kv_len)) if causal else masks.FullMask((q_len, kv_len))
    bq, bkv = _block(q_len), _block(kv_len)
    blocks = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                               block_kv_dkv_compute=bkv, use_fused_bwd_kernel=True)
    kernel = splash.make_splash_mha(masks.MultiHeadMask([head_mask] * heads), block_sizes=blocks, head_shards=1,
                                    q_seq_shards=1, interpret=interpret)
    # The kernel takes [H, T, K] per row and no scale: the queries are scaled as the einsum path scales them.
    q_BxHxTxK = (q_BxTxHxK / np.sqrt(head_dim).astype(q_BxTxHxK.dtype)).transpose(0, 2, 1, 3)
    k_BxHxSxK, v_BxHxSxK = k_BxSxHxK.transpose(0, 2, 1, 3), v_BxSxHxK.transpose(0, 2, 1, 3)
    segments = splash.SegmentIds(q=q_segments_BxT, kv=kv_segments_BxS)
    out_BxHxTxK = jax.vmap(kernel)(q_BxHxTxK, k_BxHxSxK, v_BxHxSxK, segment_ids=segments)
    return out_BxHxTxK.transpose(0, 2, 1, 3).astype(q_BxTxHxK.dtype)
