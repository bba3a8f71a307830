"""The cluster flags (--multihost and the flags it goes with) as a user gives them, through the real commands:
each mistake is one line naming the flag and the fix, before any work, and a peer that never joins ends the
wait of process 0 in our line within --cluster_timeout, not in JAX's abort."""

import subprocess
import sys
import time

import pytest

from runs import ROOT, assert_one_line_error, free_port, run_rows, script_env, write_config
from transformer_jax.__main__ import PROGRAM

# Every command that defines the cluster flags: train.py, eval.py's old form, and the subcommands ({dir}: the
# test's folder).
COMMANDS = [("train.py", []), ("eval.py", []), (PROGRAM, ["score"]), (PROGRAM, ["translate"]),
            (PROGRAM, ["translate-corpus", "--input={dir}/in.txt", "--output_dir={dir}/out"]),
            (PROGRAM, ["average"]), (PROGRAM, ["export", "--format=ctranslate2", "--output={dir}/model"])]

# (flags, fragments of the one line): flags that mean nothing without --multihost, and processes out of range.
MISTAKES = [
    (["--num_processes=2"], ["--num_processes=2 is given without --multihost", "add --multihost", "or drop it"]),
    (["--coordinator_address=127.0.0.1:1", "--process_id=0"],
     ["--coordinator_address=127.0.0.1:1 --process_id=0 are given without --multihost", "or drop them"]),
    (["--cluster_timeout=5"], ["--cluster_timeout=5 is given without --multihost"]),
    (["--multihost", "--coordinator_address=127.0.0.1:1", "--num_processes=2", "--process_id=2"],
     ["--process_id=2 is out of range: pass 0 to 1 for --num_processes=2"]),
    (["--multihost", "--coordinator_address=127.0.0.1:1", "--num_processes=2", "--process_id=-1"],
     ["--process_id=-1 is out of range: pass 0 to 1 for --num_processes=2"]),
    (["--multihost", "--process_id=-1"], ["--process_id=-1 is out of range: pass 0 or more"]),
    (["--multihost", "--coordinator_address=127.0.0.1:1", "--num_processes=0", "--process_id=0"],
     ["--num_processes=0 must be at least 1"]),
    (["--multihost", "--cluster_timeout=0"], ["--cluster_timeout=0 must be a positive number of seconds"]),
    (["--peer_timeout=5"], ["--peer_timeout=5 is given without --multihost"]),
    (["--multihost", "--peer_timeout=1"], ["--peer_timeout=1 must be at least 2 seconds"]),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every (command, mistake) pair run through the command's own parsing and main; the workdir they name."""
    directory = tmp_path_factory.mktemp("cluster_flags")
    config, workdir = write_config(directory), directory / "run"
    outcomes = {}
    for script in dict(COMMANDS):
        keys, rows = [], []
        for prefix in [prefix for name, prefix in COMMANDS if name == script]:
            for flags, _ in MISTAKES:
                config_flag = [f"--config={config}"] if script == "train.py" else []
                keys.append((script, *prefix, *flags))
                named = [arg.format(dir=directory) for arg in prefix]
                rows.append([*named, *config_flag, f"--workdir={workdir}", *flags])
        outcomes.update(zip(keys, run_rows(script, rows, directory)))
    return outcomes, workdir, directory


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join([name, *prefix[:1]]) for name, prefix in COMMANDS])
@pytest.mark.parametrize("mistake", MISTAKES, ids=[" ".join(flags) for flags, _ in MISTAKES])
def test_a_cluster_flag_that_would_be_ignored_or_names_no_process_is_one_line(results, command, mistake):
    outcomes, workdir, directory = results
    (script, prefix), (flags, fragments) = command, mistake
    assert_one_line_error(outcomes[(script, *prefix, *flags)], *fragments)
    assert not workdir.exists()  # refused as the flags were parsed, before any work
    assert not (directory / "out").exists() and not (directory / "model").exists()


def run_command(command: list[str], *flags: str) -> tuple[subprocess.CompletedProcess, float]:
    """`command` (train.py, or `-m transformer_jax COMMAND`) with `flags`, as a user runs it; its result and its
    seconds of wall."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, *command, *flags], cwd=ROOT, env=script_env(), capture_output=True,
                            text=True, timeout=300)
    return result, time.monotonic() - started


@pytest.mark.parametrize("command", [["train.py"], ["-m", "transformer_jax", "score"]], ids=["train.py", "score"])
def test_process_0_whose_peer_never_joins_ends_in_one_line_within_the_timeout(tmp_path, command):
    """Process 0 alone of two: JAX's own join aborts (a C++ check failure, SIGABRT, exit 134) after about twice
    --cluster_timeout; ours ends the wait at --cluster_timeout with one line naming what to do."""
    config, workdir, address = write_config(tmp_path), tmp_path / "run", f"127.0.0.1:{free_port()}"
    flags = [*([f"--config={config}"] if command == ["train.py"] else []), f"--workdir={workdir}", "--multihost",
             "--num_processes=2", "--process_id=0", "--cluster_timeout=5"]
    # The same start-up, ended where the join would begin (a coordinator without a port): the imports' time.
    refused, start_up = run_command(command, *flags, "--coordinator_address=127.0.0.1")
    assert_one_line_error(refused, "--coordinator_address=127.0.0.1 has no port")
    result, elapsed = run_command(command, *flags, f"--coordinator_address={address}")
    line = assert_one_line_error(result, "process 0: not all of the 2 processes (--num_processes=2) joined at "
                                 f"--coordinator_address={address} within 5 s (--cluster_timeout)",
                                 "start the other processes (--process_id=1)", "check --num_processes",
                                 "wait longer with --cluster_timeout")
    assert result.stderr.strip().splitlines()[-1] == line
    assert "Check failed" not in result.stderr and "Fatal Python error" not in result.stderr, result.stderr[-3000:]
    assert 5 < elapsed < 5 + 10 + start_up, (elapsed, start_up)  # generous: the machine is shared
    assert elapsed - start_up < 5 + 4, (elapsed, start_up)  # the wait itself; JAX's own ended after about 10 s
    assert not workdir.exists()


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[007-009],other", "SLURM_NTASKS": "3",
         "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("environment, given, found", [
    ({}, (None, None, None), (None, None, None)),  # no cluster: JAX's join says what is missing
    (SLURM, (None, None, None), (f"node007:{4242 % 4096 + 61440}", 3, 2)),
    (dict(SLURM, JAX_COORDINATOR_PORT="9999"), (None, None, None), ("node007:9999", 3, 2)),
    (SLURM, ("127.0.0.1:1234", 4, None), ("127.0.0.1:1234", 4, 2)),  # what a flag gives wins
    ({"JAX_COORDINATOR_ADDRESS": "localhost:5"}, (None, 2, 1), ("localhost:5", 2, 1)),
])
def test_the_join_settings_jax_would_detect_are_found_before_the_join(monkeypatch, environment, given, found):
    """Process 0 of a cluster JAX detects must know it is process 0 before the join, to run the coordination
    service beside itself (tests/run/test_peer_loss.py kills it in SLURM's environment)."""
    from transformer_jax.cli.cluster import detect_cluster

    for name in [*SLURM, "JAX_COORDINATOR_PORT", "JAX_COORDINATOR_ADDRESS", "KUBERNETES_SERVICE_HOST",
                 "OMPI_MCA_orte_hnp_uri"]:  # this machine's own cluster, if any
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert detect_cluster(*given, timeout=5) == found
