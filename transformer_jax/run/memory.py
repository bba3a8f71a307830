"""Whether a run fits its devices' memory: the train state before it is allocated, each compiled train step
before it runs.

Without these checks a d_ff or tokens_per_batch too large for the devices ends, after minutes of set-up,
in an allocator's out-of-memory traceback (GPU, TPU) or in the kernel killing the process (a CPU host).
The sizes are the compiler's own: the state's shard shapes, and XLA's memory analysis of each step.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from transformer_jax.errors import ConfigError

GB = 1e9


def device_memory(mesh: Mesh) -> int | None:
    """Bytes one device of `mesh` may hold: the allocator's limit on GPU/TPU; on a CPU, the host's available
    memory shared by this process's devices of the mesh. None when unknown (compile-only devices)."""
    local = [device for device in mesh.devices.flat if device.process_index == jax.process_index()]
    if not local:
        return None
    device = local[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - compile-only devices and some plugins have no allocator to ask
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        available = _host_available_memory()
        return None if available is None else available // len(local)
    return None


def _host_available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def state_bytes_per_device(abstract_state: Any) -> int:
    """Bytes of one device's shards of an abstract state (ShapeDtypeStructs carrying their shardings)."""
    total = 0
    for leaf in jax.tree.leaves(abstract_state):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


def compiled_bytes_per_device(compiled: jax.stages.Compiled) -> int | None:
    """A compiled program's peak bytes on one device by XLA's memory analysis: arguments + outputs - the
    donated (aliased) part + temporaries. None when the backend gives no analysis."""
    try:
        memory = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if memory is None:
        return None
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)


def check_fits(needed: int | None, mesh: Mesh, what: str, fix: str) -> None:
    """ConfigError when `needed` bytes per device exceed what a device of `mesh` holds (device_memory)."""
    available = device_memory(mesh)
    if needed is None or available is None or needed <= available:
        return
    platform = mesh.devices.flat[0].platform
    raise ConfigError(f"{what} needs {needed / GB:.2f} GB per device, but a {platform} device here holds "
                      f"{available / GB:.2f} GB; {fix}")
