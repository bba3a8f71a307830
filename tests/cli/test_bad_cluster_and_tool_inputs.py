"""What a user can get wrong around the commands rather than in a run's settings: the cluster (a coordinator that
does not answer, does not resolve or is missing), the platform (JAX_PLATFORMS naming one without its plugin), and the
flags and disks of the other tools (the preflight, prepare, import-marian).

Every case expects: a non-zero exit, exactly one `error: ...` line naming the problem and the fix, no traceback,
and nothing left behind that was not there.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from runs import ROOT, assert_one_line_error, copy_run, run_script, script_env, small_disk, snapshot, write_config


@pytest.fixture(scope="module")
def setup(tmp_path_factory, trained_run):
    """A trained tiny run and its config file."""
    directory = tmp_path_factory.mktemp("bad_cluster_and_tool_inputs")
    return {"config": write_config(directory), "workdir": copy_run(trained_run, directory / "run"), "dir": directory}


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_a_coordinator_that_does_not_answer_ends_in_one_line_within_the_timeout(setup, script):
    """A closed local port as the coordinator of process 1: one line naming it after --cluster_timeout, not JAX's
    abort after 5 minutes."""
    from runs import free_port

    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_script(script, *([f"--config={setup['config']}"] if script == "train.py" else []),
                        f"--workdir={setup['workdir']}", "--multihost", f"--coordinator_address={address}",
                        "--num_processes=2", "--process_id=1", "--cluster_timeout=3")
    assert_one_line_error(result, f"no coordinator answered at --coordinator_address={address} within 3 s",
                          "--cluster_timeout")
    assert time.monotonic() - started < 60


def test_sigterm_while_waiting_for_the_coordinator_stops_at_once(setup):
    from runs import free_port, start_script, wait_until_idle

    process = start_script("train.py", f"--config={setup['config']}", f"--workdir={setup['dir'] / 'joining'}",
                           "--multihost", f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2",
                           "--process_id=1", "--cluster_timeout=600")
    wait_until_idle(process)  # past the imports, into the wait
    stopped = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - stopped < 10, stderr[-2000:]
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM: nothing; training had not started")


def test_a_coordinator_name_that_does_not_resolve_is_named(monkeypatch):
    """A stubbed resolver (tests reach no other host): the name is refused before any connection."""
    import socket

    from transformer_jax.cli.cluster import wait_for_coordinator
    from transformer_jax.errors import ConfigError

    def unresolved(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolved)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(ConfigError, match=r"coordinator.invalid' does not resolve \(Name or service not known\)"):
        wait_for_coordinator("coordinator.invalid:8476", timeout=1)


def test_multihost_without_a_coordinator(setup):
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={setup['workdir']}", "--multihost")
    assert_one_line_error(result, "cannot join the multi-process run", "--coordinator_address=HOST:PORT")


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_jax_platforms_naming_a_platform_without_its_plugin(setup, script):
    # JAX_PLATFORMS is read when JAX starts its backends: a process of its own, not a row of run_rows.
    flags = [f"--config={setup['config']}"] if script == "train.py" else []
    before = snapshot(setup["workdir"])
    result = run_script(script, *flags, f"--workdir={setup['workdir']}", env=script_env(JAX_PLATFORMS="cuda"))
    assert_one_line_error(result, "JAX_PLATFORMS=cuda cannot start on this machine", "install the platform's JAX plugin",
                          "or unset JAX_PLATFORMS")
    assert snapshot(setup["workdir"]) == before


def test_no_libtpu_start_up_noise_on_a_host_without_tpu_chips(setup):
    import importlib.util

    assert importlib.util.find_spec("libtpu") is not None  # the test install has the tpu extra (the preflight's)
    env = script_env()
    del env["JAX_PLATFORMS"]  # as a user runs it: JAX picks the platforms
    result = run_script("eval.py", f"--workdir={setup['workdir']}", "--translate=-", "--mode=greedy",
                        stdin="The dog sleeps .\n", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.splitlines()) == 1
    for noise in ("TPU_WORKER_HOSTNAMES", "TPU accelerator type", "libtpu", "E0000"):
        assert noise not in result.stderr, result.stderr[-3000:]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=script_env(), capture_output=True,
                          text=True, timeout=300)


def test_preflight_given_a_workdir_that_is_not_there_creates_nothing(setup, tmp_path):
    """A mistyped --workdir must not become a run directory holding a tokenizer and a corpus."""
    for workdir in (tmp_path / "runs" / "bsae", tmp_path / "typo"):
        result = run_module("transformer_jax.aot", f"--config={setup['config']}", "--topology=v5e:2x4",
                            f"--workdir={workdir}")
        assert_one_line_error(result, f"--workdir={workdir} does not exist", f"mkdir -p {workdir}")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags, fragments", [
    (["--topology="], ["--topology is empty", "--topology=v5e:2x4"]),
    (["--topology=v5e:2x4", "--hbm_gb=0"], ["--hbm_gb=0.0 must be a positive number of GB per device"]),
])
def test_preflight_flags(setup, flags, fragments):
    assert_one_line_error(run_module("transformer_jax.aot", f"--config={setup['config']}", *flags), *fragments)


@pytest.mark.parametrize("size,fault,remedy", [
    ("8k", "no space left on the device", "free space and run the same command again"),
    ("ro", "read-only file system", "writable and run the same command again"),
])
def test_prepare_onto_a_full_or_read_only_disk_names_the_fault_and_leaves_nothing(setup, tmp_path, size, fault, remedy):
    """The remedy follows the fault (errno), and a failed first preparation removes the directories it made."""
    with small_disk(tmp_path / "disk", "8k" if size == "ro" else size) as disk:
        if size == "ro":
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        result = run_module("transformer_jax.cli.prepare", f"--config={setup['config']}",
                            f"--output={disk / 'new' / 'corpus'}")
        left = os.listdir(disk)
    assert_one_line_error(result, fault, remedy)
    assert "free space" not in result.stderr or size != "ro"
    assert left == []


def test_prepare_into_an_empty_output(setup):
    assert_one_line_error(run_module("transformer_jax.cli.prepare", f"--config={setup['config']}", "--output="),
                          "--output is empty")


@pytest.mark.parametrize("flags, fragments", [
    (["--hf_dir=nowhere", "--workdir="], ["--workdir is empty", "the run directory to create"]),
    (["--hf_dir=nowhere", "--workdir= "], ["--workdir is empty"]),
    (["--hf_dir=nowhere", "--workdir=x", "--no_such_flag=1"], ["Unknown command line flag no_such_flag", "see --help"]),
])
def test_import_marian_errors_are_one_line(setup, tmp_path, flags, fragments):
    """The import's own checks and its flag parsing follow the commands' one-line convention (exit 2)."""
    result = subprocess.run([sys.executable, "-m", "transformer_jax.cli.import_marian", *flags], cwd=tmp_path,
                            env=script_env(), capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, *fragments)
    assert os.listdir(tmp_path) == []
