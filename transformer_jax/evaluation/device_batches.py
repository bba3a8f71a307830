"""Translation batches sized for the devices that search them, when the user gives none.

On an accelerator the run's eval batching (data.eval_batch_size: 64 sentences by default, chosen for the periodic
BLEU during training) fills a sliver of the chip, and a search step is mostly launches: more sentences per step
cost little more time. So `score`, `translate`, `translate-corpus` and the `Translator` size the batches for the
devices (`data.shapes.device_translation_batching`: a share of each device's memory over the search's bytes per
sentence) unless a batch is given (`--batch_size`, `--batch_tokens`, or the Translator's keywords). On CPUs the
run's eval batching stays: a CPU's search is compute-bound at small batches already. The choice is said once.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer_jax.base.sharding import mesh_platform
from transformer_jax.data.shapes import TranslationBatching, device_translation_batching
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.translate import decoding_precision
from transformer_jax.model.config import TransformerConfig


def device_memory_bytes(devices: Sequence[jax.Device]) -> int | None:
    """The memory XLA may allocate on each of `devices` (the smallest; its allocator's limit), or None where the
    backend does not say (a CPU). The limit, not what is free now: every process of a run computes the same."""
    try:
        limits = [(device.memory_stats() or {}).get("bytes_limit") for device in devices]
    except jax.errors.JaxRuntimeError:  # compile-only devices have no memory to report
        return None
    return min(limits) if limits and all(limits) else None


def sized_batching(run_batching: TranslationBatching, model: TransformerConfig, options: DecodeOptions, dtype: str,
                   mesh: Mesh, memory: int | None = None) -> tuple[TranslationBatching, str | None]:
    """The batching a search of `options` uses on `mesh` when no batch is given, and the line that says why (None
    when it is the run's own: on CPUs, or where the devices do not say their memory). `memory`: each device's
    bytes, where the devices cannot say (the preflight's compile-only ones: the chip's HBM)."""
    platform = mesh_platform(mesh)
    devices = list(mesh.devices.flat)
    if platform == "cpu":
        memory = None
    elif memory is None:
        memory = device_memory_bytes(devices)
    if memory is None:
        return run_batching, None
    # The caches' dtype is the search's compute dtype there (decoding_precision decides it).
    searched = decoding_precision({}, model, dtype, platform)[1]
    cache_bytes = jnp.dtype(searched.compute_dtype).itemsize
    batching = device_translation_batching(model, options, memory, len(devices), cache_bytes)
    line = (f"translation batches sized for {len(devices)} x {devices[0].device_kind} ({memory / 1e9:.0f} GB each) "
            f"for {options.describe()}: up to {batching.batch_size} sentences, {batching.batch_tokens} source tokens "
            "a batch (--batch_size/--batch_tokens choose others)")
    return batching, line
