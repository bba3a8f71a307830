"""Device mesh, logical-axis rules and shardings for the train state and batches.

The mesh has two axes: `data` (pure data parallelism: parameters replicated) and `fsdp` (data
parallelism with parameters and optimizer state sharded). Batches split their leading axis over
both. Parameters name their axes logically (`vocab`, `embed`, `heads`, `kv`, `mlp`); the rules
below map `embed` (d_model, present in every weight matrix) onto `fsdp`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.errors import MeshError

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



def make_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp) mesh over all devices; -1 for one axis means 'all remaining devices'."""
    devices = list(jax.devices() if devices is None else devices)
    count = len(devices)
    if data == -1 and fsdp == -1:
        raise MeshError("only one of mesh.data and mesh.fsdp may be -1")
    if data == -1:
        data = count // fsdp if fsdp > 0 else 0
    if fsdp == -1:
        fsdp = count // data if data > 0 else 0
    if data <= 0 or fsdp <= 0 or data * fsdp != count:
        raise MeshError(
            f"mesh data={data} x fsdp={fsdp} does not cover the {count} available devices; "
            "set --config.mesh.data and --config.mesh.fsdp so that their product is the device count"
        )
    return Mesh(np.asarray(devices).reshape(data, fsdp), BATCH_AXES)


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
