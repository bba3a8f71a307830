"""A process of a multi-process run dies: every other process ends with one line of ours naming it and exit status 4
(base/peer_watch.py), never JAX's abort (a C++ stack, status 134) nor a traceback of the collective it broke; the
same command on every process then resumes the run. Through train.py itself, killed with SIGKILL on localhost."""

import json
import pathlib
import signal
import subprocess
import time

import pytest

from runs import finish_all, free_port, script_env, start_script, write_config
from transformer_jax.base import PEER_LOST_EXIT, jax_heartbeat_seconds
from transformer_jax.base.peer_watch import PeerWatch

PEER_TIMEOUT = 3


def start_run(config: str, workdir: pathlib.Path, count: int, steps: int, slurm: bool = False
              ) -> list[subprocess.Popen]:
    """The tiny run as `count` processes of train.py with one CPU device each: joined by the three cluster flags,
    or (`slurm`) by `--multihost` alone in the environment SLURM gives a job's tasks, which JAX detects."""
    port = free_port()
    processes = []
    for index in range(count):
        if slurm:
            cluster = []
            env = script_env(1, SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS=str(count),
                             SLURM_PROCID=str(index), SLURM_LOCALID=str(index), JAX_COORDINATOR_PORT=str(port))
        else:
            cluster = [f"--coordinator_address=localhost:{port}", f"--num_processes={count}", f"--process_id={index}"]
            env = script_env(1)
        processes.append(start_script("train.py", f"--config={config}", f"--workdir={workdir}", "--multihost",
                                      *cluster, f"--config.training.num_train_steps={steps}",
                                      "--config.training.log_every=1", f"--peer_timeout={PEER_TIMEOUT}", env=env))
        processes[-1].port = port
    return processes


def services_on(port: int) -> list[str]:
    """The coordination-service processes (base/coordination_service.py) serving `port` on this machine."""
    found = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(word.endswith("coordination_service.py") for word in words) and f"[::]:{port}" in words:
            found.append(cmdline.parent.name)
    return found


def records(workdir: pathlib.Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def wait_for(condition, processes: list[subprocess.Popen], timeout: float = 300) -> None:
    """Until `condition()` holds; a process ending first, or the timeout, fails with every process's last output."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline or any(p.poll() is not None for p in processes):
            for process in processes:
                if process.poll() is None:
                    process.kill()
            said = [f"process {i} (status {p.wait()}): {p.communicate()[1][-2000:]}" for i, p in enumerate(processes)]
            raise AssertionError("the run ended early or timed out:\n" + "\n".join(said))
        time.sleep(0.05)


def assert_ended_by_the_watch(process: subprocess.Popen, lost: int, count: int, killed_at: float) -> None:
    """`process` ended with status 4 within the watch's time, its one error line naming process `lost`."""
    _, stderr = process.communicate(timeout=120)
    took = time.monotonic() - killed_at
    assert process.returncode == PEER_LOST_EXIT, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == [errors[0]] and f"process {lost} of {count} stopped answering" in errors[0], stderr[-3000:]
    assert "restart every process with the same command" in errors[0].lower(), errors[0]
    for mark in ("Traceback", "Check failure", "Fatal Python error", "Gloo"):
        assert mark not in stderr.replace("[Gloo] Rank", ""), stderr[-3000:]
    # The watch's wait, its acknowledgements' wait on process 0, a few beats and a loaded CI machine: not JAX's 100 s.
    assert took < 3 * PEER_TIMEOUT + 45, took


def test_a_peer_killed_mid_run_ends_every_other_process_with_one_line(tmp_path):
    """Three processes; process 2 is killed while they train: 0 and 1 (which hears of it from 0) both end."""
    config, workdir = write_config(tmp_path), tmp_path / "run"
    processes = start_run(config, workdir, 3, steps=400)
    wait_for(lambda: records(workdir), processes)  # step 1 logged: every process is training
    processes[2].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    for index in (0, 1):
        assert_ended_by_the_watch(processes[index], 2, 3, killed_at)
    processes[2].wait()


def test_process_0_killed_mid_run_ends_the_others_with_the_line_not_jax_abort(tmp_path):
    """Process 0 holds JAX's coordination service; ours runs it in a process of its own that outlives process 0, so
    process 1 hears of the death from its watch, not from a closed connection (JAX's abort, status 134). On a
    cluster JAX detects (here SLURM's environment, `--multihost` alone): process 0 is found before the join, so
    its service runs beside it as with the three flags (the last test checks that case's service)."""
    config, workdir = write_config(tmp_path), tmp_path / "run"
    processes = start_run(config, workdir, 2, steps=400, slurm=True)
    wait_for(lambda: records(workdir), processes)  # step 1 logged: every process is training
    assert services_on(processes[0].port)
    processes[0].send_signal(signal.SIGKILL)
    assert_ended_by_the_watch(processes[1], 0, 2, time.monotonic())
    processes[0].wait()


def test_a_peer_killed_after_training_ends_process_0_and_the_same_command_finishes_the_run(tmp_path):
    """Two processes; process 1 is killed once training is over (the test translation): process 0 ends with the
    line, its checkpoint whole; the same command on both processes then finishes the run. Three steps (the tiny
    run's first dev loss, its checkpoints at 2 and 3) are enough: what is killed is the test translation after them."""
    config, workdir, steps = write_config(tmp_path), tmp_path / "run", 3
    processes = start_run(config, workdir, 2, steps)
    wait_for(lambda: any(r["step"] == steps and r["split"] == "dev" for r in records(workdir)), processes)
    processes[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert_ended_by_the_watch(processes[0], 1, 2, killed_at)
    processes[1].wait()
    assert not (workdir / "test_final.json").exists()
    rerun = start_run(config, workdir, 2, steps)
    wait_for(lambda: services_on(rerun[0].port), rerun)  # serving while the run goes on
    finish_all(rerun)
    assert not services_on(rerun[0].port)  # a finished run leaves no service behind
    assert json.loads((workdir / "test_final.json").read_text())["step"] == steps
    assert [r["step"] for r in records(workdir) if r["split"] == "train"] == list(range(1, steps + 1))


def watch(process_id: int, ended: int | None = None, processes: int = 3) -> PeerWatch:
    """A watch whose verdicts are read directly (no thread, no store): `ended` as if announced."""
    peer = PeerWatch(None, process_id, processes, timeout=5, resume="Rerun.")
    peer._ended = ended
    return peer


@pytest.mark.parametrize("values, ended, verdict", [
    ({1: "run 3", 2: "run 4"}, None, None),                       # every peer beating
    ({1: "end 0 3", 2: "run 4"}, None, None),                     # a finished peer still beating (the barrier)
    ({1: "end 2 3", 2: "run 4"}, 143, None),                      # both ending, each with its own line
    ({1: "end 2 3", 2: "run 4"}, None, "process 1 of 3 ended with exit status 2"),
])
def test_process_0_ends_the_run_for_a_peer_ended_by_an_error_only_after_the_timeout(values, ended, verdict):
    peer, seen = watch(0, ended), {}
    assert peer._verdict(values, seen, now=100.0) is None  # never at once
    beats = {key: f"{value[:-1]}9" for key, value in values.items()}  # later beats of the same state
    found = peer._verdict(beats, seen, now=106.0)
    assert (found and found[0].split(" (")[0]) == verdict and (found is None or found[1] == 1)


def test_a_silent_peer_is_lost_after_the_timeout_finished_or_not_and_process_0_relays_the_loss():
    peer, seen = watch(0, ended=0), {}
    assert peer._verdict({1: "end 0 3", 2: "run 4"}, seen, now=100.0) is None
    assert peer._verdict({1: "end 0 4", 2: "run 4"}, seen, now=104.9) is None  # process 2 silent 4.9 s of 5
    line, lost = peer._verdict({1: "end 0 5", 2: "run 4"}, seen, now=105.0)
    assert lost == 2 and line.startswith("process 2 of 3 stopped answering 5 s ago") and line.endswith("Rerun.")
    follower = watch(1)
    assert follower._verdict({0: f"lost 9 {line}"}, {}, now=0.0) == (line, 0)


def test_jax_finds_a_dead_process_only_after_ours_and_its_acknowledgements():
    for timeout in (2, 30, 120):
        assert jax_heartbeat_seconds(timeout) >= max(100, 2 * timeout + 10)


def test_process_0_refuses_a_coordinator_port_something_already_listens_on(tmp_path):
    """gRPC would share the port (an earlier process 0's lingering service, say), and the join could reach it."""
    import socket

    from runs import assert_one_line_error, run_script

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_script("train.py", f"--config={write_config(tmp_path)}", f"--workdir={tmp_path / 'run'}",
                            "--multihost", f"--coordinator_address=localhost:{port}", "--num_processes=2",
                            "--process_id=0", env=script_env(1))
    assert_one_line_error(result, f"--coordinator_address=localhost:{port}", f"port {port} is in use on this host")
    assert not (tmp_path / "run").exists()


def test_an_error_waits_for_the_watch_once_however_many_places_catch_it(monkeypatch):
    """The Trainer and run_command both give the watch its time; an error they both see is waited for once."""
    from transformer_jax.base import await_verdict_if_lost_peer, peer_watch

    monkeypatch.setattr(peer_watch, "BEAT_SECONDS", 0.05)
    monkeypatch.setattr(peer_watch, "_WATCH", [PeerWatch(None, 1, 2, timeout=0.3, resume="Rerun.")])
    error = ValueError("UNKNOWN: Gloo AllGather failed: Connection closed by peer [127.0.0.1]:1")
    began = time.monotonic()
    await_verdict_if_lost_peer(error)
    first = time.monotonic() - began
    await_verdict_if_lost_peer(error)
    assert first >= 0.5 and time.monotonic() - began - first < 0.1
    began = time.monotonic()
    await_verdict_if_lost_peer(ValueError("a bug of ours"))  # not a collective a peer broke: no wait
    assert time.monotonic() - began < 0.1
