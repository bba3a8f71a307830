"""Is a checkpoint intact? Per-array checksums, finiteness and shape checks; damaged checkpoints set aside.

A complete checkpoint directory can still be damaged later (a truncated copy, a bad disk). Every
checkpoint carries a checksum of each array of the state, verified on restore. A read that fails
for any reason other than a config mismatch is reported as CorruptCheckpointError; the newest
checkpoint that restores intact is used, and the damaged newer ones are moved aside to
`<directory>.corrupt/` (never deleted).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax.errors import (
    CheckpointError,
    CorruptCheckpointError,
    ShapeMismatchError,
)
from transformer_jax.base.console import CLOSED_LOOP
from transformer_jax.base.files import exists, make_dirs, move
from transformer_jax.base import workdir as layout


def checkpoint_label(directory: str, step: int) -> str:
    """How messages name the checkpoint of `step`: "checkpoint <directory>/<step>"."""
    return f"checkpoint {directory}/{step}"


def unbox_saved(tree: Any) -> Any:
    """Saved logical-axis boxes come back as {"value": array}; return the arrays themselves."""
    if isinstance(tree, dict):
        if set(tree) == {"value"}:
            return tree["value"]
        return {key: unbox_saved(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(unbox_saved(value) for value in tree)
    return tree


def _leaves_by_path(tree: Any) -> dict[str, Any]:
    """{'params/encoder/...': leaf} for every array-like leaf (logical-axis boxes removed)."""
    leaves = jax.tree_util.tree_leaves_with_path(
        unbox_saved(nn.meta.unbox(tree)), is_leaf=lambda x: hasattr(x, "shape")
    )
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


# Position p weighs p * step + 1 (mod 2^32), step from Knuth's multiplicative hash (2654435761). The weights of
# version 1 (checkpoints saved before 2026-12-07, which record no version) are even at every odd position, so a
# change d of one value there is lost whenever d * weight = 0 (mod 2^32): a change of 2^28 in a float32's top byte at
# one position in 16. Version 2 doubles the step: every weight is odd, and a change of any one value always shows.
_WEIGHT_STEPS = {1: 2654435761, 2: (2 * 2654435761) % 2**32}
CHECKSUM_WEIGHTS = 2  # the version every save records (`checksum_weights` in the checkpoint's meta)
_HOST_CHUNK = 1 << 22  # elements per pass of host_checksums: bounds its temporaries to a few MB


@functools.partial(jax.jit, static_argnums=1)
def _checksums(leaves: dict[str, jax.Array], weights: int = CHECKSUM_WEIGHTS) -> dict[str, jax.Array]:
    """Per array: the sum of its element bit patterns weighted by position (weights of version `weights`),
    modulo 2^32.

    Integer sums are exact and order-free, so the value does not depend on the sharding or on how
    many processes compute it; a changed value, a zeroed block or two swapped values change it.
    """
    step_weight = _WEIGHT_STEPS[weights]

    def checksum(x: jax.Array) -> jax.Array:
        x = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
        position, stride = jnp.zeros(x.shape, jnp.uint32), 1
        for axis in reversed(range(x.ndim)):  # the flat index, without reshaping a sharded array
            position = position + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride)
            stride *= x.shape[axis]
        return jnp.sum(bits * (position * jnp.uint32(step_weight) + jnp.uint32(1)), dtype=jnp.uint32)

    return {key: checksum(leaf) for key, leaf in leaves.items()}


def state_checksums(state: Any, prefix: str = "", weights: int = CHECKSUM_WEIGHTS) -> dict[str, int]:
    """{path: checksum} of every array of `state` (keys start with `prefix`), with the weights of version
    `weights`."""
    sums = jax.device_get(_checksums(_leaves_by_path(state), weights))
    return {prefix + key: int(value) for key, value in sums.items()}


def _host_checksum(x: np.ndarray, weights: int = CHECKSUM_WEIGHTS) -> int:
    """`_checksums`'s value for one array in host memory, computed with NumPy a chunk at a time.

    The weight of flat position `start + i` is `(i * W + 1) + start * W` (mod 2^32): each chunk reuses the
    first chunk's weights shifted by a constant. uint32 arithmetic on arrays wraps as the device's does.
    """
    flat = np.ascontiguousarray(x).reshape(-1)
    flat = flat.view(np.uint8) if flat.dtype == np.bool_ else flat
    bits = flat.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[flat.dtype.itemsize])
    step_weight = _WEIGHT_STEPS[weights]
    first = np.arange(min(flat.size, _HOST_CHUNK), dtype=np.uint32) * np.uint32(step_weight) + np.uint32(1)
    total = 0
    for start in range(0, flat.size, _HOST_CHUNK):
        chunk = bits[start:start + _HOST_CHUNK].astype(np.uint32)
        shift = np.uint32(start * step_weight % 2**32)
        total += int(np.sum(chunk * (first[:chunk.size] + shift), dtype=np.uint32))
    return total % 2**32


def host_checksums(state: Any, prefix: str = "", weights: int = CHECKSUM_WEIGHTS) -> dict[str, int]:
    """`state_checksums` of a state held in host memory (NumPy arrays, or jax.Arrays in host memory that this
    process holds whole), computed on the host: no device program, no compile, callable from any thread."""
    return {prefix + key: _host_checksum(np.asarray(leaf), weights) for key, leaf in _leaves_by_path(state).items()}


def host_is_finite(tree: Any) -> bool:
    """`tree_is_finite` of a tree held in host memory, computed on the host."""
    return all(bool(np.isfinite(np.asarray(leaf)).all()) for leaf in jax.tree.leaves(tree))


def checksum_meta(sums: dict[str, int]) -> dict[str, Any]:
    """What a save records of its checksums in its meta: the sums and the version of their weights."""
    return {"checksums": sums, "checksum_weights": CHECKSUM_WEIGHTS}


def verify_checksums(restored: Any, meta: dict[str, Any], where: str, prefix: str = "") -> None:
    """Raise CorruptCheckpointError naming the first array whose checksum differs from the one its save recorded in
    `meta` (`checksum_meta`; a checkpoint saved before the weights' version was recorded used version 1)."""
    saved = meta.get("checksums", {})
    for key, value in state_checksums(restored, prefix, meta.get("checksum_weights", 1)).items():
        if key in saved and saved[key] != value:
            raise CorruptCheckpointError(f"{where}: array {key} does not match its checksum")


def check_record(record: Any, name: str, where: str) -> None:
    """Raise CorruptCheckpointError when the `name` record (data, meta) of a checkpoint is not a JSON object."""
    if not isinstance(record, dict):
        raise CorruptCheckpointError(f"{where} is damaged: its {name} record is a JSON {type(record).__name__}, "
                                     "not an object")


@jax.jit
def tree_is_finite(tree: Any) -> jax.Array:
    """True when every element of every leaf is finite."""
    leaves = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves))


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
    """{'params/encoder/layer_0/...': shape} for every array-like leaf (logical-axis boxes removed)."""
    return {key: tuple(leaf.shape) for key, leaf in _leaves_by_path(tree).items()}


def check_shapes(saved: Any, expected: Any, what: str) -> None:
    """Raise ShapeMismatchError naming the first leaf whose saved shape differs from the expected one."""
    saved_shapes = _shapes_by_path(saved)
    for key, shape in _shapes_by_path(expected).items():
        if saved_shapes.get(key) != shape:
            raise ShapeMismatchError(
                f"{what} does not match the config: {key} is {saved_shapes.get(key, 'missing')} on disk "
                f"but {shape} in the model; use the config the run was started with, or a new workdir"
            )


@contextlib.contextmanager
def reading(where: str, advice: str = "") -> Iterator[None]:
    """Report any failure to read `where` back (other than a config mismatch) as CorruptCheckpointError.

    The reports of reads Orbax abandons are dropped from the start (`drop_abandoned_io_reports`): a read that
    fails (a checkpoint rotated away under it) abandons the others, which may end while the failure unwinds."""
    drop_abandoned_io_reports()
    try:
        yield
    except CorruptCheckpointError as error:
        raise CorruptCheckpointError(f"{error}{advice}") from None
    except ShapeMismatchError:
        raise
    except Exception as error:  # noqa: BLE001 - truncated files, bad JSON, ... all mean "unreadable"
        silence_abandoned_io()
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        detail = detail.split(" See full TensorStore details")[0][:200]
        raise CorruptCheckpointError(f"{where} cannot be read ({detail}){advice}") from None


def _is_abandoned_io(unraisable: Any) -> bool:
    """Whether an unraisable exception comes from a checkpoint read or write Orbax gave up (silence_abandoned_io)."""
    code = getattr(unraisable.object, "cr_code", None) or getattr(unraisable.object, "__code__", None)
    files = [getattr(code, "co_filename", "")]
    files += [frame.filename for frame in traceback.extract_tb(unraisable.exc_traceback)]
    return (CLOSED_LOOP in str(unraisable.exc_value)
            or any(f"{os.sep}{package}{os.sep}" in name for name in files for package in ("orbax", "tensorstore")))


def drop_abandoned_io_reports() -> None:
    """Keep the unraisable reports of reads and writes Orbax abandoned ("Event loop is closed", "Exception ignored
    in ...") from standard error (one hook, installed once; every other report still prints).

    When one file of a checkpoint cannot be read (or written: a full disk), Orbax closes that restore's (or
    save's) event loop while the other reads or writes are still in flight; each that ends after it reports
    the closed loop from TensorStore's thread, at once or when collected, at the latest at interpreter exit.
    Installed before a read (`reading`): those ending while the failure unwinds came before any handler.
    """
    previous = sys.unraisablehook
    if getattr(previous, "abandoned_io_silenced", False):
        return

    def hook(unraisable: Any) -> None:
        if not _is_abandoned_io(unraisable):
            previous(unraisable)

    hook.abandoned_io_silenced = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def silence_abandoned_io() -> None:
    """Keep the reads and writes Orbax abandons after a failed one from printing tracebacks (on a failure): their
    unraisable reports (`drop_abandoned_io_reports`), asyncio's "Task exception was never retrieved" and the
    warnings of coroutines never started, which add nothing to the one line already given."""
    drop_abandoned_io_reports()
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # "Task exception was never retrieved"
    warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)  # never started


def _all_processes_agree(ok: bool) -> bool:
    """True when `ok` holds on every process (one process alone: `ok` itself)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


def newest_intact(
    directory: str, steps_newest_first: Iterable[int], restore: Callable[[int], Any]
) -> tuple[int, Any, list[tuple[int, CheckpointError]]] | None:
    """(step, restore(step), [(unreadable newer step, its error)]) of the first step every process restores intact.

    Returns None when there are no steps; raises CheckpointError
    when there are some but none restores.
    """
    unreadable: list[tuple[int, CheckpointError]] = []
    for step in steps_newest_first:
        error = None
        try:
            restored = restore(step)
        except CorruptCheckpointError as caught:
            error = caught
        # Every process must resume from the same step, so one process's failure counts for all.
        if not _all_processes_agree(error is None):
            error = error or CorruptCheckpointError(
                f"{checkpoint_label(directory, step)} cannot be read by another process"
            )
            unreadable.append((step, error))
            continue
        return step, restored, unreadable
    if unreadable:
        raise CheckpointError(
            f"no checkpoint in {directory} can be restored (newest: {unreadable[0][1]}); move the "
            "damaged ones away to start over, or use a new workdir"
        )
    return None


def set_aside(directory: str, steps: list[int]) -> dict[int, str]:
    """Move the step directories `steps` to `<directory>.corrupt/` (process 0 moves, all processes wait).

    Returns {step: where it went} (on process 0; empty on the others).
    """
    moved = {}
    if jax.process_index() == 0:
        for step in steps:
            destination = os.path.join(directory + layout.CORRUPT_SUFFIX, str(step))
            suffix = 0
            while exists(destination):  # a step set aside before keeps its copy
                suffix += 1
                destination = os.path.join(directory + layout.CORRUPT_SUFFIX, f"{step}.{suffix}")
            make_dirs(os.path.dirname(destination))
            move(os.path.join(directory, str(step)), destination)
            moved[step] = destination
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("unreadable checkpoints set aside")
    return moved
