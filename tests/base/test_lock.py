"""One job owns a workdir: run.lock refuses a second job, is released at exit, and is taken over when stale."""

import dataclasses
import json
import os
import logging
import subprocess
import sys
import time

import pytest

from runs import NO_TEST_TRANSLATION, assert_one_line_error, free_port, script_env, start_script, write_config
from transformer_jax.base import lock as run_lock
from transformer_jax.base import workdir as layout
from transformer_jax.base.lock import Owner, RunLock, WorkdirLockedError, read_owner
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.base.log_records import read_metrics


def write_lock(workdir, owner: Owner) -> None:
    (workdir / layout.LOCK).write_text(json.dumps(dataclasses.asdict(owner)))


def test_a_second_lock_is_refused_naming_the_owner_and_release_frees_the_workdir(tmp_path):
    first = RunLock(str(tmp_path))
    first.acquire()
    owner = read_owner(str(tmp_path / layout.LOCK))
    assert owner == first.owner and owner.pid == first.owner.pid
    with pytest.raises(WorkdirLockedError, match=rf"in use by another training job \(host {owner.host}, "
                                                 rf"pid {owner.pid}, started 20\d\d-.*choose another --workdir"):
        RunLock(str(tmp_path)).acquire()
    first.release()
    assert not (tmp_path / layout.LOCK).exists()
    second = RunLock(str(tmp_path))
    second.acquire()
    second.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary files left either


@pytest.mark.parametrize("where", ["just after the file is created", "while JAX starts its backend"])
def test_a_stop_right_after_the_lock_is_taken_releases_it(tmp_path, monkeypatch, where):
    """SIGTERM raises wherever the main thread is: once the lock file exists, a stop anywhere releases it (it was
    left behind when the signal came before the lock knew it was its own, or while JAX started its backend)."""
    import jax

    class Stop(BaseException):  # what the SIGTERM handler raises (cli.stops)
        pass

    if where == "just after the file is created":
        create = run_lock._create_exclusively

        def create_then_stop(path, content):
            assert create(path, content)
            raise Stop

        monkeypatch.setattr(run_lock, "_create_exclusively", create_then_stop)
    else:
        def process_count_then_stop():
            assert (tmp_path / layout.LOCK).exists()
            raise Stop

        monkeypatch.setattr(jax, "process_count", process_count_then_stop)
    with pytest.raises(Stop):
        with run_lock.owning(str(tmp_path)):
            pass
    assert not (tmp_path / layout.LOCK).exists()


def test_a_lock_of_a_process_that_is_gone_is_taken_over(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_lock(tmp_path, dataclasses.replace(Owner.this_process(), pid=gone.pid, process_start=""))
    with caplog.at_level(logging.WARNING):
        taker = RunLock(str(tmp_path))
        taker.acquire()
    assert read_owner(str(tmp_path / layout.LOCK)).token == taker.owner.token
    assert any(f"pid {gone.pid}" in r.getMessage() and "gone" in r.getMessage() for r in caplog.records)
    taker.release()


def test_a_live_process_keeps_its_lock_but_a_reused_pid_does_not(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = dataclasses.replace(Owner.this_process(), pid=alive.pid,
                                    process_start=run_lock._process_start(alive.pid))
        write_lock(tmp_path, owner)
        with pytest.raises(WorkdirLockedError, match=f"pid {alive.pid}"):
            RunLock(str(tmp_path)).acquire()
        # The same pid now running another process (its start time differs): the owner is gone.
        write_lock(tmp_path, dataclasses.replace(owner, process_start="1"))
        taker = RunLock(str(tmp_path))
        taker.acquire()
        taker.release()
    finally:
        alive.kill()
        alive.wait()


def test_another_hosts_lock_is_stale_once_its_heartbeat_is_old(tmp_path):
    elsewhere = dataclasses.replace(Owner.this_process(), host="another-host", pid=1)
    write_lock(tmp_path, elsewhere)
    with pytest.raises(WorkdirLockedError, match="host another-host, pid 1"):
        RunLock(str(tmp_path)).acquire()
    write_lock(tmp_path, dataclasses.replace(elsewhere, heartbeat=time.time() - run_lock.STALE_SECONDS - 1))
    taker = RunLock(str(tmp_path))
    taker.acquire()
    taker.release()


@pytest.mark.parametrize("content", [b'{"host": "vm", "pi', b"\xff\x00garbage", b""])
def test_a_damaged_lock_file_is_taken_over_saying_it_could_not_be_read(tmp_path, caplog, content):
    (tmp_path / layout.LOCK).write_bytes(content)
    taker = RunLock(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        taker.acquire()
    assert read_owner(str(tmp_path / layout.LOCK)) == taker.owner
    taker.release()
    [line] = [record.getMessage() for record in caplog.records if "taking over" in record.getMessage()]
    assert "its content could not be read" in line and "pid -1" not in line, line


def test_the_heartbeat_renews_the_lock_and_release_leaves_another_jobs_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_SECONDS", 0.05)
    holder = RunLock(str(tmp_path))
    holder.acquire()
    taken = holder.owner.heartbeat
    deadline = time.time() + 10
    while read_owner(str(tmp_path / layout.LOCK)).heartbeat == taken and time.time() < deadline:
        time.sleep(0.05)
    assert read_owner(str(tmp_path / layout.LOCK)).heartbeat > taken
    # Another job took the workdir over (this one looked dead): releasing must not remove its lock. The renewals
    # stop first, so that none is halfway between reading this job's lock and rewriting it when the other's lands.
    holder._stop.set()
    holder._heartbeat.join()
    other = dataclasses.replace(Owner.this_process(), host="another-host", token="other")
    write_lock(tmp_path, other)
    holder.release()
    assert read_owner(str(tmp_path / layout.LOCK)) == other


def test_on_gs_the_lock_is_created_only_if_absent(gcs_workdir):
    first, second = RunLock(gcs_workdir), RunLock(gcs_workdir)
    first.acquire()
    try:
        with pytest.raises(WorkdirLockedError, match="in use by another training job"):
            second.acquire()
    finally:
        first.release()
    second.acquire()
    second.release()


def test_two_train_py_on_one_workdir_the_second_is_refused_and_the_run_is_as_one(tmp_path):
    config = write_config(tmp_path)
    workdir = tmp_path / "run"
    args = [f"--config={config}", f"--workdir={workdir}", "--config.training.num_train_steps=12",
            "--config.training.checkpoint_every=4", "--config.training.eval_every=0", NO_TEST_TRANSLATION]
    first = start_script("train.py", *args)
    try:
        deadline = time.time() + 240
        while not (workdir / layout.LOCK).exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        owner = read_owner(str(workdir / layout.LOCK))
        second = subprocess.run(start_script("train.py", *args).args, capture_output=True, text=True,
                                timeout=240, env=script_env())
        assert_one_line_error(second, f"workdir {workdir} is in use", f"pid {owner.pid}", "host ", "started ")
        _, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stderr[-3000:]
    train_steps = [r["step"] for r in read_metrics(str(workdir)) if r["split"] == "train"]
    assert train_steps == list(range(1, 13))
    assert Checkpointer(str(workdir / "checkpoints"), read_only=True).steps() == [8, 12]
    assert not (workdir / layout.LOCK).exists()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["12", "8"]


def test_every_process_of_a_multi_process_job_is_refused_on_an_owned_workdir(tmp_path):
    config = write_config(tmp_path)
    workdir = tmp_path / "run"
    workdir.mkdir()
    write_lock(workdir, dataclasses.replace(Owner.this_process(), host="another-host", pid=7))
    port = free_port()
    processes = [start_script("train.py", f"--config={config}", f"--workdir={workdir}", "--multihost",
                              f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={index}",
                              env=script_env(1))
                 for index in range(2)]
    for index, process in enumerate(processes):
        stdout, stderr = process.communicate(timeout=240)
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        assert_one_line_error(result, "is in use by another training job",
                              "host another-host, pid 7" if index == 0 else "process 0 names it")
    assert sorted(p.name for p in workdir.iterdir()) == [layout.LOCK]


def test_the_lock_works_where_hard_links_are_refused(tmp_path, monkeypatch):
    """gcsfuse and some network filesystems refuse os.link: the lock is then created with O_EXCL."""
    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    first = RunLock(str(tmp_path))
    first.acquire()
    assert read_owner(str(tmp_path / layout.LOCK)) == first.owner
    with pytest.raises(WorkdirLockedError):
        RunLock(str(tmp_path)).acquire()
    first.release()
    assert not (tmp_path / layout.LOCK).exists() and not list(tmp_path.glob("run.lock.new*"))
    second = RunLock(str(tmp_path))
    second.acquire()
    assert read_owner(str(tmp_path / layout.LOCK)) == second.owner
    second.release()
