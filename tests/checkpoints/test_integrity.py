"""Checkpoint integrity: checksums that see any change, shape checks, read failures named as corruption."""

import json

import numpy as np
import pytest

from transformer_jax.errors import (
    CheckpointError,
    CorruptCheckpointError,
    ShapeMismatchError,
)
from transformer_jax.checkpoints.integrity import (
    CHECKSUM_WEIGHTS,
    check_shapes,
    checksum_meta,
    host_checksums,
    host_is_finite,
    newest_intact,
    reading,
    state_checksums,
    tree_is_finite,
    unbox_saved,
    verify_checksums,
)


def test_checksums_change_with_any_value_or_position():
    tree = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int32)}
    base = state_checksums(tree)
    assert set(base) == {"a", "b"} and state_checksums(tree) == base
    swapped = {"a": tree["a"][::-1], "b": tree["b"]}  # the same values, other places
    assert state_checksums(swapped)["a"] != base["a"] and state_checksums(swapped)["b"] == base["b"]
    flipped = tree["a"].copy()
    flipped.view(np.uint32)[1, 2] ^= 1  # one bit of one value
    assert state_checksums({"a": flipped, "b": tree["b"]})["a"] != base["a"]


# Position 15 weighs 15 * 2654435761 + 1, a multiple of 16 (mod 2^32), under version 1's weights.
MULTIPLE_OF_16 = 15


def test_a_high_bit_changed_anywhere_shows_in_the_checksum_and_older_checkpoints_still_verify():
    """Version 1's weights are even at odd positions: a change of 2^28 (one bit of a float32's top byte, as a flipped
    byte of a compressed checkpoint gives) at a weight divisible by 16 cancels out. Every weight of version 2 is odd."""
    assert (MULTIPLE_OF_16 * 2654435761 + 1) % 16 == 0
    values = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    changed = values.copy()
    changed.view(np.uint32)[MULTIPLE_OF_16] ^= 1 << 28
    assert changed[MULTIPLE_OF_16] != values[MULTIPLE_OF_16]
    assert state_checksums({"a": changed}, weights=1) == state_checksums({"a": values}, weights=1)  # missed
    assert state_checksums({"a": changed}) != state_checksums({"a": values})  # version 2, every save's
    assert state_checksums({"a": values}) == state_checksums({"a": values}, weights=CHECKSUM_WEIGHTS) == \
        host_checksums({"a": values}) != state_checksums({"a": values}, weights=1)
    # A checkpoint saved before version 2 recorded none: its sums verify under version 1's weights.
    verify_checksums({"a": values}, {"checksums": state_checksums({"a": values}, weights=1)}, "checkpoint run/4")
    with pytest.raises(CorruptCheckpointError, match="array a does not match its checksum"):
        verify_checksums({"a": changed}, checksum_meta(state_checksums({"a": values})), "checkpoint run/4")


def test_host_checksums_equal_the_devices_for_every_dtype_across_chunks(monkeypatch):
    import jax.numpy as jnp
    import ml_dtypes

    from transformer_jax.checkpoints import integrity

    monkeypatch.setattr(integrity, "_HOST_CHUNK", 7)  # several chunks per array: the weights' shift is exercised
    rng = np.random.default_rng(0)
    tree = {"f": rng.normal(size=(5, 6, 7)).astype(np.float32), "h": rng.normal(size=(33,)).astype(ml_dtypes.bfloat16),
            "i": rng.integers(-5, 5, (4, 9)).astype(np.int32), "key": np.array([3, 4], np.uint32),
            "scalar": np.float32(2.5), "mask": np.array([True, False, True])}
    assert host_checksums(tree, "state/") == state_checksums(tree, "state/")
    on_device = {key: jnp.asarray(value) for key, value in tree.items()}
    assert host_checksums(on_device) == state_checksums(tree)
    assert host_is_finite(tree) and not host_is_finite({**tree, "f": np.full(3, np.nan, np.float32)})


def test_saved_boxes_are_unboxed_and_non_finite_values_found():
    saved = {"dense": {"kernel": {"value": np.ones((2, 3))}}, "scale": [{"value": np.zeros(2)}]}
    unboxed = unbox_saved(saved)
    assert unboxed["dense"]["kernel"].shape == (2, 3) and unboxed["scale"][0].shape == (2,)
    assert bool(tree_is_finite(unboxed))
    unboxed["scale"][0][1] = np.inf
    assert not bool(tree_is_finite(unboxed))


def test_check_shapes_names_the_first_leaf_that_differs():
    expected = {"params": {"embed": np.zeros((10, 4)), "out": np.zeros(4)}}
    check_shapes({"params": {"embed": {"value": np.zeros((10, 4))}, "out": np.zeros(4)}}, expected, "ckpt")
    with pytest.raises(ShapeMismatchError, match=r"ckpt does not match the config: params/embed is \(12, 4\)"):
        check_shapes({"params": {"embed": np.zeros((12, 4)), "out": np.zeros(4)}}, expected, "ckpt")
    with pytest.raises(ShapeMismatchError, match="params/out is missing on disk"):
        check_shapes({"params": {"embed": np.zeros((10, 4))}}, expected, "ckpt")


def test_read_failures_become_corrupt_checkpoint_errors_but_shape_mismatches_do_not():
    with pytest.raises(CorruptCheckpointError, match=r"^ckpt/3 cannot be read \(Expecting property name.*\); advice$"):
        with reading("ckpt/3", "; advice"):
            json.loads("{")
    with pytest.raises(ShapeMismatchError):
        with reading("ckpt/3"):
            raise ShapeMismatchError("differs")


def test_newest_intact_skips_unreadable_steps_and_reports_them():
    def restore(step):
        if step > 4:
            raise CorruptCheckpointError(f"step {step} damaged")
        return f"state {step}"

    step, state, unreadable = newest_intact("ckpt", [6, 5, 4, 2], restore)
    assert (step, state, [(bad, str(error)) for bad, error in unreadable]) == (
        4, "state 4", [(6, "step 6 damaged"), (5, "step 5 damaged")])
    assert newest_intact("ckpt", [], restore) is None
    with pytest.raises(CheckpointError, match=r"no checkpoint in ckpt can be restored \(newest: step 6 damaged\)"):
        newest_intact("ckpt", [6, 5], restore)
