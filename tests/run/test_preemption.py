"""Preemption: a signal to any one process stops every process at the same step, at any step.

The flag, its handler and the agreement are tested in-process; the multi-process case runs train.py
as 2 JAX processes on localhost (jax.distributed, gloo on CPU), through tests/run/
train_counting_steps.py, which reports how many updates each process has made.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import time

import jax

from runs import finish_all, free_port, script_env, start_script, write_config
from transformer_jax.base.sharding import make_mesh
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.base.log_records import read_metrics
from transformer_jax.run.preemption import StopAgreement, StopFlag

STEPS = 300  # also training.log_every: no log step (where flags were once compared) near the signal
SIGNAL_AFTER = 5  # updates made by process 1 before it is sent SIGTERM
SETTINGS = (f"--config.training.log_every={STEPS}", "--config.training.eval_every=0",
            "--config.training.checkpoint_every=100000")


def test_a_signal_sets_the_flag_and_later_ones_do_not_cut_the_stop_short(capsys):
    previous = signal.getsignal(signal.SIGTERM)
    flag = StopFlag()
    flag.install()
    try:
        assert not flag.raised
        signal.raise_signal(signal.SIGTERM)
        assert flag.raised and flag.signal_number == signal.SIGTERM
        signal.raise_signal(signal.SIGINT)  # a second one (Ctrl-C) while the checkpoint is written: noted, said
        assert flag.signal_number == signal.SIGTERM and flag.signals == 2
        assert "signal 2 again: stopping after the checkpoint is written" in capsys.readouterr().out
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous  # given back once the loop has finished its saves


def test_one_process_stops_at_the_step_its_signal_arrives_in():
    flag = StopFlag()
    must_stop = StopAgreement(flag, make_mesh(devices=jax.devices()[:1]))
    done = jax.numpy.zeros(())
    assert not must_stop.after_update(done) and not must_stop.between_batches()
    flag.step = 7  # the loop's step when the signal comes
    flag.install()
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        flag.uninstall()
    assert must_stop.after_update(done) and must_stop.between_batches()
    assert flag.arrived_step == 7 and flag.arrived is not None


def test_the_agreement_answers_in_flight_minus_one_steps_after_the_flag_is_set():
    """The multi-process path, run in one process: the answer read after an update is the one started
    `in_flight` - 1 updates before; an evaluation's check reads every pending one and one started now."""
    done = jax.numpy.zeros(())
    for in_flight in (1, 2, 3):
        flag = StopFlag()
        must_stop = StopAgreement(flag, make_mesh(), in_flight, collective=True)
        assert [must_stop.after_update(done) for _ in range(3)] == [False] * 3
        flag.signal_number = signal.SIGTERM
        answers = [must_stop.after_update(done) for _ in range(in_flight)]
        assert answers == [False] * (in_flight - 1) + [True], (in_flight, answers)
    flag = StopFlag()
    must_stop = StopAgreement(flag, make_mesh(), 3, collective=True)
    assert [must_stop.after_update(done) for _ in range(3)] + [must_stop.between_batches()] == [False] * 4
    flag.signal_number = signal.SIGTERM
    assert must_stop.between_batches()


def launch(config: str, workdir: pathlib.Path, counts: pathlib.Path, *extra: str) -> list[subprocess.Popen]:
    """train.py as 2 processes of 1 CPU device each, reporting their update counts under `counts`."""
    env = script_env(1, STEPS_TO=str(counts))
    port = free_port()
    return [start_script("tests/run/train_counting_steps.py", f"--config={config}", f"--workdir={workdir}",
                         f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={index}",
                         "--multihost", *SETTINGS, *extra, env=env)
            for index in range(2)]


def finish(processes: list[subprocess.Popen], timeout: float = 300) -> list[str]:
    """Wait for every process; their stderr, after checking that each exited with status 0."""
    return [stderr for _, stderr in finish_all(processes, timeout)]


def updates_made(counts: pathlib.Path, index: int) -> int:
    path = counts / f"process_{index}.txt"
    lines = path.read_text().split() if path.exists() else []
    return int(lines[-1]) if lines else 0


def test_sigterm_to_one_process_stops_both_at_the_same_step_soon_after(tmp_path):
    config = write_config(tmp_path)
    workdir, counts = tmp_path / "workdir", tmp_path / "counts"
    processes = launch(config, workdir, counts, f"--config.training.num_train_steps={STEPS}")
    deadline = time.time() + 240
    while updates_made(counts, 1) < SIGNAL_AFTER and time.time() < deadline:
        assert all(process.poll() is None for process in processes), "a process ended before the signal"
        time.sleep(0.005)
    signalled_at = updates_made(counts, 1)
    assert signalled_at >= SIGNAL_AFTER, "process 1 made no progress"
    os.kill(processes[1].pid, signal.SIGTERM)  # process 1 only
    # Both exit 143 (stopped before the last step: a scheduler restarts them); process 0 says it on stdout.
    stderrs = [stdout + stderr for stdout, stderr in finish_all(processes, 300, status=143)]

    stopped = [re.findall(r"stopped by (.*) at step (\d+): checkpoint \d+ saved", stderr) for stderr in stderrs]
    assert [len(found) for found in stopped] == [1, 1], stderrs[0][-2000:] + stderrs[1][-2000:]
    stop_step = int(stopped[1][0][1])
    assert int(stopped[0][0][1]) == stop_step  # the same step on both processes
    # One step to start the agreement, one to read it, one more for the step in progress.
    assert signalled_at <= stop_step <= signalled_at + 3, (signalled_at, stop_step)
    assert stopped[0][0][0] == "a signal to another process" and stopped[1][0][0] == f"signal {signal.SIGTERM}"
    assert updates_made(counts, 0) == updates_made(counts, 1) == stop_step
    checkpointer = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    assert checkpointer.steps() == [stop_step]
    assert len(checkpointer.meta(stop_step)["open_window"]) == stop_step  # no log line yet: all steps open
    assert not (workdir / "metrics.jsonl").exists()

    finish(launch(config, workdir, tmp_path / "resumed_counts", f"--config.training.num_train_steps={stop_step + 2}"))
    assert Checkpointer(str(workdir / "checkpoints"), read_only=True).latest_step() == stop_step + 2
    assert [(r["step"], r["split"]) for r in read_metrics(str(workdir))] == [(stop_step + 2, "train")]
    assert json.loads((workdir / "test_final.json").read_text())["step"] == stop_step + 2
