"""Damaged checkpoints: detected on restore, reported, set aside (never deleted), the previous one used."""

import gc
import logging
import shutil

import jax
import numpy as np
import pytest
from runs import flip_a_readable_bit

from transformer_jax.errors import CheckpointError
from transformer_jax.checkpoints.initial import initial_params
from transformer_jax.checkpoints.integrity import CHECKSUM_WEIGHTS
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.run import Trainer, assemble_run
from transformer_jax.base.log_records import read_metrics

# When Orbax fails to read a damaged file it abandons the other reads of that restore; their
# coroutines complain when collected ("Exception ignored in ... _read_array_index_and_device_put").
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def biggest_array_file(step_dir):
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def truncate(step_dir):
    path = biggest_array_file(step_dir)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_bit(step_dir):
    flip_a_readable_bit(step_dir / "state")  # a stored value changes: only the checksum can tell


def garble_json(step_dir):
    (step_dir / "data" / "metadata").write_text('{"epoch": ')


@pytest.fixture(scope="module")
def finished(trained_run):
    """A finished 6-step tiny run: checkpoints at 4 and 6 (plus the best by dev loss). Read only."""
    return trained_run["workdir"]


@pytest.mark.parametrize("damage, reported", [(truncate, "cannot be read"), (flip_a_bit, "does not match its checksum")])
def test_a_damaged_latest_checkpoint_is_reported_set_aside_and_the_run_redone_from_the_previous(
        finished, tmp_path, run_config, caplog, damage, reported):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    damage(workdir / "checkpoints" / "6")
    damaged = {p.relative_to(workdir / "checkpoints" / "6"): p.read_bytes()
               for p in (workdir / "checkpoints" / "6").rglob("*") if p.is_file()}

    with caplog.at_level(logging.WARNING):
        trainer = Trainer(assemble_run(run_config, str(workdir)))
        trainer.run()
        trainer.close()

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{workdir}/checkpoints/6" in w and reported in w for w in warnings), warnings
    aside = workdir / "checkpoints.corrupt" / "6"
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == damaged
    # Resumed from step 4: steps 5 and 6 were trained again, exactly as the first time.
    assert (workdir / "metrics.jsonl").read_bytes() == (finished / "metrics.jsonl").read_bytes()
    assert [r["step"] for r in read_metrics(str(workdir))][-3:] == [5, 6, 6]
    restored, original = (Checkpointer(str(d / "checkpoints"), read_only=True).restore_params(6)
                          for d in (workdir, finished))
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(original), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    gc.collect()  # collect the abandoned reads here, under this module's warning filter


def test_when_no_checkpoint_restores_the_run_stops_and_moves_nothing(finished, tmp_path, run_config):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    steps = Checkpointer(str(workdir / "checkpoints"), read_only=True).steps()
    for step in steps:
        garble_json(workdir / "checkpoints" / str(step))
    trainer = Trainer(assemble_run(run_config, str(workdir)))
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be restored"):
        trainer.restore_latest()
    trainer.close()
    assert Checkpointer(str(workdir / "checkpoints"), read_only=True).steps() == steps
    assert not (workdir / "checkpoints.corrupt").exists()


def test_what_an_interrupted_save_left_is_gone_once_the_checkpointer_is_made(tmp_path):
    """Orbax clears unfinished saves in a thread only its next save waits for: ours waits at start-up, so a
    process that stops before saving (a signal while compiling) leaves no thread to die at exit."""
    directory = tmp_path / "checkpoints"
    leftover = directory / "4.orbax-checkpoint-tmp-1764133200"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "half_written").write_bytes(b"\0" * 1024)
    checkpointer = Checkpointer(str(directory))
    assert not leftover.exists()
    assert checkpointer.steps() == []
    checkpointer.close()


def test_a_save_copies_the_state_and_writes_it_in_the_background(tmp_path, caplog):
    """The training thread only starts the host copy: it may donate the state to its next step at once; the
    checkpoint holds the values saved, verified by their checksums; non-finite parameters are refused there."""
    from flax import struct

    @struct.dataclass
    class State:
        params: dict
        step: jax.Array

    state = State(params={"w": jax.numpy.arange(6.0).reshape(2, 3)}, step=jax.numpy.int32(3))
    step = jax.jit(lambda s: s.replace(params=jax.tree.map(lambda x: x + 1, s.params)), donate_argnums=0)
    checkpointer = Checkpointer(str(tmp_path))
    assert checkpointer.in_background
    assert checkpointer.save(3, state, {"position": 3}, {})
    writer = checkpointer._writer
    state = step(state)  # the saved arrays are donated: the copy is the checkpoint's
    checkpointer.wait()
    assert not writer.is_alive() and checkpointer.steps() == [3]
    restored, data, meta = checkpointer.restore(3, jax.eval_shape(lambda: state))
    np.testing.assert_array_equal(restored.params["w"], np.arange(6.0).reshape(2, 3))
    assert data == {"position": 3} and set(meta["checksums"]) == {"params/w", "step"}
    assert meta["checksum_weights"] == CHECKSUM_WEIGHTS  # the version its restore verifies with

    broken = state.replace(params={"w": state.params["w"] * np.nan})
    with caplog.at_level(logging.ERROR):
        checkpointer.save(4, broken, {}, {})
        checkpointer.wait()
    assert "parameters at step 4 are not finite: checkpoint not written" in caplog.text
    assert checkpointer.steps() == [3]
    checkpointer.close()


def test_a_step_rotated_away_while_a_reader_reads_it_is_named_as_rotated(finished, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    reader = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    assert 4 in reader.steps()  # listed, then removed by the training run's rotation before it is read
    shutil.rmtree(workdir / "checkpoints" / "4")
    with pytest.raises(CheckpointError, match=r"checkpoints/4 was removed while it was read: the training run "
                                              r"writing .* keeps only its newest checkpoints \(training.keep_"
                                              r"checkpoints\) and rotated it away; run the same command again"):
        reader.restore_params(4)
    # A step that is there but cannot be read is still named damaged, with the reader's own flag.
    truncate(workdir / "checkpoints" / "6")
    with pytest.raises(CheckpointError, match="checkpoints/6 cannot be read .*; choose another with --checkpoint"):
        reader.restore_params(6)
    gc.collect()


def test_a_step_whose_removal_is_under_way_while_it_is_read_is_named_as_rotated(finished, tmp_path, monkeypatch,
                                                                                  caplog):
    """The writer removes a rotated step's files one by one, then its folder: a read that meets a missing file while
    the folder is still listed waits for it to vanish, then says it was rotated away (not that it is damaged)."""
    import threading

    import orbax.checkpoint as ocp

    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.copytree(finished, tmp_path / "run")
    original = ocp.CheckpointManager.restore

    def restore(self, step, *args, **kwargs):  # its arrays and metadata already removed, its folder a moment later
        shutil.rmtree(checkpoints / str(step) / "state")
        (checkpoints / str(step) / "_CHECKPOINT_METADATA").unlink()
        threading.Timer(0.3, shutil.rmtree, args=(checkpoints / str(step),)).start()
        return original(self, step, *args, **kwargs)

    reader = Checkpointer(str(checkpoints), read_only=True)
    monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError, match=r"checkpoints/6 was removed while it "
                                                                                r"was read: the training run writing"):
        reader.restore_params(6)
    reader.close()
    assert not any("/checkpoints/6" in record.getMessage() for record in caplog.records)  # Orbax's about it
    gc.collect()


def test_a_step_rotated_away_while_a_reader_lists_the_steps_is_no_step(finished, tmp_path, monkeypatch, caplog):
    """Orbax lists the step folders, then stats each: a step the writer removes in between was a raw
    FileNotFoundError out of the reader's start and of `steps`. It is listed again, without it; a writer that keeps
    saving and rotating at every listing is one CheckpointError."""
    from orbax.checkpoint._src.path import step as orbax_steps

    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.copytree(finished, tmp_path / "run")
    original, listings = orbax_steps._StandardNameFormat.find_all, []

    def find_all(self, base_path):  # lists; at some listings the writer then saves step N + 2 and removes step N
        found = list(original(self, base_path))
        listings.append(sorted(step.step for step in found))
        if len(listings) in (1, 3) or len(listings) > 4:
            newest = max(step.step for step in found)
            shutil.copytree(checkpoints / str(newest), checkpoints / str(newest + 2))
            shutil.rmtree(checkpoints / str(newest))
        return iter(found)

    monkeypatch.setattr(orbax_steps._StandardNameFormat, "find_all", find_all)
    with caplog.at_level(logging.WARNING):
        reader = Checkpointer(str(checkpoints), read_only=True)  # the first listing rotated: listed again
        assert reader.steps() == [4, 10] and listings == [[4, 6], [4, 8], [4, 8], [4, 10]]
        with pytest.raises(CheckpointError, match=r"the checkpoints in .*/checkpoints kept vanishing while they were "
                                                  r"listed \(.*/checkpoints/18 last\); if a training run writes "
                                                  r"there, run the same command again"):
            reader.steps()  # rotated at every listing: five in a row
        reader.close()
    assert len(listings) == 9
    assert not any("does not exist" in record.getMessage() for record in caplog.records)  # Orbax's, about them


def test_a_step_rotated_away_while_the_best_is_chosen_is_no_candidate(finished, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.copytree(finished, tmp_path / "run")
    original = ocp.CheckpointManager.restore

    def restore(self, step, *args, **kwargs):  # step 4's metadata is read just after the writer removed it
        if step == 4:
            shutil.rmtree(checkpoints / "4", ignore_errors=True)
        return original(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
    reader = Checkpointer(str(checkpoints), best_metric="dev_loss", best_mode="min", read_only=True)
    assert reader.steps() == [4, 6] and reader.best_step() == 6
    reader.close()
    gc.collect()


def test_a_fine_tune_from_a_run_without_checkpoints_names_training_init_from(finished, tmp_path, run_config):
    source = tmp_path / "source"
    shutil.copytree(finished, source, ignore=lambda folder, names: ["checkpoints"] if folder == str(finished) else [])
    (source / "checkpoints").mkdir()
    current = Trainer(assemble_run(run_config, str(tmp_path / "new"))).state.params
    with pytest.raises(CheckpointError) as error:
        initial_params(str(source), current, scanned=False)
    message = str(error.value)
    assert message.startswith(f"training.init_from={source}: no checkpoint in {source}/checkpoints")
    assert "set training.init_from to a run with an intact one" in message
    assert "--workdir" not in message and "--checkpoint" not in message
