"""One entry point for every decoding mode, the precision a search runs in, and the search split over a mesh.

`decoding_precision` chooses, once per program, the weights' dtype and the model config a search runs;
`translate_batch` runs the search `DecodeOptions` asks for on a batch; `translate_rows` runs it on a
batch whose rows are split over a device mesh, each device searching its own rows alone.
"""

from __future__ import annotations

import functools
import typing
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from transformer_jax.base.sharding import BATCH_AXES
from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.options import DecodeOptions, require
from transformer_jax.decoding.sampling import greedy_decode, sample_decode
from transformer_jax.model.config import Dtype, TransformerConfig

# The dtypes a search runs in: "" (the model's own) or one a model computes in.
DTYPES = ("", *typing.get_args(Dtype))


# The parameters the model only ever reads in its compute dtype: every matmul's kernel (Flax's dense layers
# promote it, so do ours) and the embedding tables (token and learned positions: cast after the lookup, or before
# `attend`). Biases and LayerNorm's scales are not among them: some are added in float32.
COMPUTE_DTYPE_WEIGHTS = ("kernel", "embedding", "position_embedding")


def compute_dtype_weights(params: Any, dtype: Any) -> Any:
    """`params` with the weights the model reads only in `dtype` (`COMPUTE_DTYPE_WEIGHTS`) cast to it: the same
    values every matmul computes with, and no cast of every weight at each step of a search loop."""
    def cast(path: tuple, x: Any) -> Any:
        # The leaf's own name: the last dict key (a boxed parameter's path ends in its box's attribute).
        name = next((key.key for key in reversed(path) if isinstance(key, jax.tree_util.DictKey)), None)
        return x.astype(dtype) if name in COMPUTE_DTYPE_WEIGHTS and jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree_util.tree_map_with_path(cast, params)


def decoding_precision(params: Any, config: TransformerConfig, dtype: str,
                       platform: str) -> tuple[Any, TransformerConfig]:
    """The weights and model config a search runs on `platform` ("cpu", "gpu", "tpu"), in `dtype`.

    dtype "" keeps the model's own dtype; "float32" or "bfloat16" casts the floating-point weights and
    runs the matmuls in it (softmax, LayerNorm statistics and scores stay float32). On CPUs the matmuls
    also return float32 before rounding and the caches are float32 (`TransformerConfig.float32_dot_outputs`,
    model/precision.py): XLA:CPU runs bfloat16 matmuls natively only that way. Accelerators keep the
    model's dtypes (bfloat16 caches take half the memory). A float32 model is the same either way.
    On GPUs the self-attention cache is one chunk (`TransformerConfig.chunked_decoding_cache` off): no
    conditional in the search loop.
    A model trained with cuDNN's attention (attention_backend="cudnn") decodes with "fused" off GPUs.
    The matmul weights of a model computing in a narrower dtype than it stores are cast once here
    (`compute_dtype_weights`), not at every step of the search.
    """
    require(dtype in DTYPES, f"decoding dtype={dtype!r} is not one of {list(DTYPES)} ('' = the model's own dtype)")
    if dtype and (config.dtype, config.param_dtype) != (dtype, dtype):
        target = jnp.dtype(dtype)
        params = jax.tree.map(lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
        config = config.replace(dtype=dtype, param_dtype=dtype)
    if config.dtype != config.param_dtype:
        params = compute_dtype_weights(params, config.compute_dtype)
    if platform == "cpu" and not config.float32_dot_outputs:
        config = config.replace(float32_dot_outputs=True)
    if platform == "gpu" and config.chunked_decoding_cache:
        # A conditional on a GPU copies its predicate to the host and waits for it: the chunked cache's
        # 8 per layer would stall every step of the loop. One chunk read whole has none.
        config = config.replace(chunked_decoding_cache=False)
    return params, config.runnable_on(platform)


def translate_batch(
    params: Any, config: TransformerConfig, src_tokens: jax.Array,
    options: DecodeOptions = DecodeOptions(), rng: jax.Array | None = None, row_ids: jax.Array | None = None,
) -> jax.Array:
    """[B, S] source ids -> [B, L] output ids by `options.mode`: "beam" (the best), "greedy" or "sample".

    Runs in the precision `params` and `config` have (see `decoding_precision`). Sampling draws from
    `rng` (or `jax.random.key(options.seed)` when none is given) folded with each row's id (`row_ids`, default
    its place in the batch; see `sample_decode`).
    """
    if options.mode == "beam":
        return beam_search(params, config, src_tokens, beam_size=options.beam_size, alpha=options.alpha,
                           max_extra_length=options.max_extra_length)[0][:, 0]
    if options.mode == "greedy":
        return greedy_decode(params, config, src_tokens, max_extra_length=options.max_extra_length)
    rng = jax.random.key(options.seed) if rng is None else rng
    return sample_decode(params, config, src_tokens, rng, temperature=options.temperature,
                         top_k=options.top_k, top_p=options.top_p, max_extra_length=options.max_extra_length,
                         row_ids=row_ids)


@functools.partial(jax.jit, static_argnames=("config", "options", "mesh"))
def translate_rows(params: Any, src_BxS: jax.Array, rng: jax.Array, config: TransformerConfig,
                   options: DecodeOptions, mesh: Mesh, row_ids_B: jax.Array | None = None) -> jax.Array:
    """[B, S] -> [B, L] output ids, each device decoding its own block of rows with the whole parameters.

    `params` must be replicated on `mesh` (and in the precision `decoding_precision` chose for the mesh's
    platform) and B a multiple of its size. When the mesh spans several processes, `src_BxS` is a global
    array (every process placing the same batch, `base.sharding.place_rows`) and so is the result
    (`process_allgather` reads it whole); so is `row_ids_B` when given. Inside the shard_map every device
    searches alone: a search over a batch sharded by jit would gather caches across devices at every step.
    Sampling draws each row from `rng` folded with its id (`row_ids_B`, default its place in the whole
    batch), so a split batch samples the tokens one device would.
    """
    rows = PartitionSpec(BATCH_AXES)
    if row_ids_B is None:
        row_ids_B = jnp.arange(src_BxS.shape[0], dtype=jnp.uint32)
    # check_vma=False: the search loops' carries start as constants (typed as replicated) and become
    # per-device values, which the check rejects; nothing here communicates, so nothing relies on it.
    decode = jax.shard_map(lambda p, src, key, ids: translate_batch(p, config, src, options, key, ids), mesh=mesh,
                           in_specs=(PartitionSpec(), rows, PartitionSpec(), rows), out_specs=rows, check_vma=False)
    return decode(params, src_BxS, rng, row_ids_B)
