"""Device mesh, logical-axis rules and shardings for the train state and batches; CPU device counts.

The mesh has two axes: `data` (pure data parallelism: parameters replicated) and `fsdp` (data
parallelism with parameters and optimizer state sharded). Batches split their leading axis over
both. Parameters name their axes logically (`vocab`, `embed`, `heads`, `kv`, `mlp`); the rules
below map `embed` (d_model, present in every weight matrix) onto `fsdp`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.errors import ConfigError, MeshError

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)

LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("embed", FSDP_AXIS),
    ("vocab", None),
    ("heads", None),
    ("kv", None),
    ("mlp", None),
    ("layers", None),  # the stacked layer axis of scanned stacks (model.scan_layers)
)


def make_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None,
              num_slices: int | None = None, where: str = "available") -> Mesh:
    """The (data, fsdp) mesh of a run over `devices` (default: all), laid out along their interconnect.

    -1 for one axis means 'all remaining devices'. train.py, eval.py and the preflight
    (transformer_jax.aot, on compile-only devices) all build their mesh here. With several slices
    (`num_slices`) the data axis spans them (only gradients cross the slower data-center network);
    fsdp stays inside a slice; by default the slices are read from the devices (`slice_index`, TPU).
    `where` says which devices in errors ("available", "v5e:4x4").
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_slices is None:
        num_slices = len({getattr(device, "slice_index", 0) for device in devices})
    count = len(devices)
    if data == -1 and fsdp == -1:
        raise MeshError("only one of mesh.data and mesh.fsdp may be -1")
    for name, size in (("data", data), ("fsdp", fsdp)):
        if size != -1 and size <= 0:
            raise MeshError(f"mesh.{name}={size} must be positive (or -1: the devices the other axis leaves)")
    for name, size, rest in (("fsdp", fsdp, data), ("data", data, fsdp)):
        if rest == -1 and count % size:
            other = "data" if name == "fsdp" else "fsdp"
            raise MeshError(f"mesh.{name}={size} does not divide the {count} {where} devices, so mesh.{other}=-1 "
                            f"cannot take the rest; set --config.mesh.{name} to a divisor of {count}")
    if data == -1:
        data = count // fsdp
    if fsdp == -1:
        fsdp = count // data
    if data * fsdp != count:
        raise MeshError(
            f"mesh data={data} x fsdp={fsdp} does not cover the {count} {where} devices; "
            "set --config.mesh.data and --config.mesh.fsdp so that their product is the device count"
        )
    if num_slices > 1:
        if data % num_slices:
            raise MeshError(f"mesh.data={data} is not a multiple of the {num_slices} slices; "
                            "the data axis must span the slices")
        grid = mesh_utils.create_hybrid_device_mesh((data // num_slices, fsdp), (num_slices, 1), devices)
        return Mesh(np.asarray(grid), BATCH_AXES)
    try:
        grid = mesh_utils.create_device_mesh((data, fsdp), devices, allow_split_physical_axes=True)
    except (AssertionError, ValueError, NotImplementedError):
        # mesh_utils lays out only one device per chip; libtpu describes v4 one device per TensorCore.
        # Then the devices go in id order, which walks the torus axis by axis.
        grid = np.asarray(sorted(devices, key=lambda d: (d.process_index, d.id))).reshape(data, fsdp)
    return Mesh(np.asarray(grid), BATCH_AXES)


# Each CPU device holds a whole copy of the parameters when decoding, so a large host stops at this many.
MAX_AUTOMATIC_CPU_DEVICES = 8
# The most CPU devices --cpu_devices accepts: XLA:CPU runs one thread per device in every collective,
# and past a few hundred their rendezvous times out and aborts the process.
MAX_CPU_DEVICES = 64


def automatic_cpu_devices() -> int:
    """One CPU device per core this process may run on (its affinity; a container's CPU quota is not read),
    at most MAX_AUTOMATIC_CPU_DEVICES."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, MAX_AUTOMATIC_CPU_DEVICES)


def set_cpu_devices(count: int | None) -> int | None:
    """Give JAX's CPU backend `count` devices (0: one per usable core, at most 8); None leaves the choice
    to the user's XLA_FLAGS/JAX_NUM_CPU_DEVICES (else one per core, as 0). Call before any JAX work.

    XLA:CPU spreads one device's large matmuls over the cores but runs a decoding step's many small
    operations on one thread: on 2 cores, two devices each searching half the rows (`translate_rows`)
    decode a split 1.8x faster than one device (BENCHMARKS.md, split). Returns the count set, or None
    when the user's setting stands (or JAX has already started: then a count other than its own is a
    ConfigError). Other backends (GPU, TPU) are not affected.
    """
    if count is not None and count < 0:
        raise ConfigError(f"cpu_devices={count} must be >= 0 (0: one per core)")
    if count is not None and count > MAX_CPU_DEVICES:  # XLA:CPU's rendezvous of that many threads aborts
        raise ConfigError(f"cpu_devices={count} is more than {MAX_CPU_DEVICES} CPU devices (each holds a copy of "
                          f"the model; more than the cores only adds waiting); pass --cpu_devices=0 for one per core")
    user_set = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "") or (
        jax.config.jax_num_cpu_devices != -1)  # also set by the JAX_NUM_CPU_DEVICES variable
    if count is None and user_set:
        return None
    chosen, count = count, count or automatic_cpu_devices()
    if jax.config.jax_num_cpu_devices == count:
        return count
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX has started: its CPU devices are fixed for this process
        started = len(jax.devices("cpu"))
        if chosen is not None and chosen != started:
            raise ConfigError(f"cpu_devices={chosen}: JAX already started with {started} CPU device(s) in this "
                              "process; choose the count before any JAX work") from None
        return None
    return count


def mesh_platform(mesh: Mesh) -> str:
    """The platform of the mesh's devices ("cpu", "gpu", "tpu"), compile-only devices included."""
    return mesh.devices.flat[0].platform


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over data x fsdp; other axes whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def state_shardings(mesh: Mesh, abstract_state: Any) -> Any:
    """NamedShardings for every leaf of a (boxed) state, from its logical axis names and the rules."""
    logical_specs = nn.get_partition_spec(abstract_state)
    return nn.logical_to_mesh_sharding(logical_specs, mesh, LOGICAL_AXIS_RULES)


def init_sharded(create: Callable[[], Any], mesh: Mesh) -> tuple[Any, Any]:
    """Run `create()` under jit so each device materializes only its own shards; returns (state, shardings)."""
    abstract_state = jax.eval_shape(create)
    shardings = state_shardings(mesh, abstract_state)
    return jax.jit(create, out_shardings=shardings)(), shardings


def host_cpu_device() -> jax.Device | None:
    """A CPU device of this process (JAX has one next to any accelerator), or None when JAX_PLATFORMS leaves
    the CPU backend out."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return None


def place_rows(batch: Any, mesh: Mesh) -> Any:
    """A batch (an array or a tree of arrays) every process holds whole, its rows split over the mesh.

    Each device copies only its own block of rows; unlike `device_put`, this also works when the
    mesh spans several processes.
    """
    sharding = batch_sharding(mesh)
    return jax.tree.map(
        lambda value: jax.make_array_from_callback(value.shape, sharding, lambda index: value[index]), batch)


def place_whole(tree: Any, shardings: Any) -> Any:
    """`tree`'s arrays, whole on this host (NumPy or one CPU device's), placed as `shardings` (a prefix of the
    tree: one NamedSharding per leaf or logical-axis box) say; each process puts only the shards of its own
    devices, so every process passes the same values. Compiles nothing."""

    def place(sharding: NamedSharding, leaf: Any) -> jax.Array:
        whole = np.asarray(leaf)  # a view of a CPU device's buffer: no copy
        return jax.make_array_from_callback(whole.shape, sharding, lambda index: np.asarray(whole[index]))

    return jax.tree.map(lambda sharding, subtree: jax.tree.map(functools.partial(place, sharding), subtree),
                        shardings, tree)


def abstract_with_shardings(state: Any, shardings: Any) -> Any:
    """`state` as ShapeDtypeStructs carrying their shardings (logical-axis boxes kept), for restoring."""

    def abstract(sharding: NamedSharding, leaf: Any) -> Any:
        if isinstance(leaf, nn.meta.AxisMetadata):
            value = leaf.unbox()
            return leaf.replace_boxed(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(abstract, shardings, state, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def global_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Place this process's part of the batch onto the mesh as one global array per key.

    Each process passes the rows it read (its disjoint shard); the global batch is their
    concatenation in process order.
    """
    sharding = batch_sharding(mesh)
    if jax.process_count() == 1:
        return {key: jax.device_put(value, sharding) for key, value in batch.items()}
    return {
        key: jax.make_array_from_process_local_data(sharding, value) for key, value in batch.items()
    }
