"""The workdir file layer on a local directory and on a `gs://` bucket (a local GCS emulator)."""

import os

import pytest

from transformer_jax.base import files
from transformer_jax.cli.run_directory import ensure_writable_workdir
from transformer_jax.base.log_records import read_metrics
from transformer_jax.run.metrics_log import MetricsLog


@pytest.fixture(params=["local", "gcs"])
def workdir(request, tmp_path):
    """A directory that does not exist yet: under tmp_path, or on the GCS emulator."""
    if request.param == "local":
        return str(tmp_path / "run")
    return request.getfixturevalue("gcs_workdir")


def test_local_paths_and_urls_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert files.is_local("runs/a") and files.is_local("/abs") and not files.is_local("gs://b/run")
    assert files.absolute("runs/a") == str(tmp_path / "runs" / "a")
    assert files.absolute("gs://b/run") == "gs://b/run"


def test_atomic_writes_replace_the_content_and_leave_no_temporary_object(workdir):
    path = os.path.join(workdir, "sub", "config.json")
    assert not files.exists(path)
    files.write_atomically(path, "first")
    files.write_atomically(path, "second\n")
    assert files.read_text(path) == "second\n"
    files.write_atomically(path, b"\x00\xffbytes")
    assert files.read_bytes(path) == b"\x00\xffbytes"
    assert files.is_file(path) and not files.is_dir(path)
    assert files.is_dir(os.path.join(workdir, "sub"))
    assert files.list_names(os.path.join(workdir, "sub")) == ["config.json"]


def test_appends_keep_earlier_lines(workdir):
    files.make_dirs(workdir)
    path = os.path.join(workdir, "log.jsonl")
    files.append_text(path, "a\n")
    files.append_text(path, "b\n")
    assert files.read_text(path) == "a\nb\n"


def test_move_carries_a_directory_and_its_files(workdir):
    source, destination = os.path.join(workdir, "checkpoints", "4"), os.path.join(workdir, "checkpoints.corrupt", "4")
    files.write_atomically(os.path.join(source, "data", "x"), "payload")
    files.write_atomically(os.path.join(source, "meta"), "step 4")
    files.write_atomically(os.path.join(workdir, "checkpoints", "6", "meta"), "step 6")
    assert sorted(files.list_names(os.path.join(workdir, "checkpoints"))) == ["4", "6"]
    files.make_dirs(os.path.dirname(destination))
    files.move(source, destination)
    assert files.read_text(os.path.join(destination, "data", "x")) == "payload"
    assert files.read_text(os.path.join(destination, "meta")) == "step 4"
    assert not files.exists(os.path.join(source, "data", "x")) and not files.exists(source)
    # Listings read before the move (object-store clients cache them) no longer show the moved directory.
    assert files.list_names(os.path.join(workdir, "checkpoints")) == ["6"]


def test_writable_workdir_check_leaves_nothing_behind(workdir):
    ensure_writable_workdir(workdir)
    files.write_atomically(os.path.join(workdir, "marker"), "")  # an object store lists only objects
    assert files.list_names(workdir) == ["marker"]


def test_metrics_log_resume_drops_later_steps_byte_for_byte(workdir):
    files.make_dirs(workdir)
    log = MetricsLog(workdir)
    for step in (1, 2, 3):
        log.write(step, "train", {"loss": 1.0 / step})
    log.close()
    resumed = MetricsLog(workdir, resume_step=2)
    resumed.write(3, "train", {"loss": 0.25})
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(workdir)] == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert files.read_text(os.path.join(workdir, "metrics.jsonl")) == (
        '{"step": 1, "split": "train", "loss": 1.0}\n{"step": 2, "split": "train", "loss": 0.5}\n'
        '{"step": 3, "split": "train", "loss": 0.25}\n'
    )
    assert any(name.startswith("events.out.tfevents") for name in files.list_names(os.path.join(workdir, "tensorboard")))
