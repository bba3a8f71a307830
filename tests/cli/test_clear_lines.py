"""Lines that name the real fault and a flag the command has: an unknown `--config.KEY` ("unknown key", the nearest
key), a missing or empty --config, prepare's advice (its --output, not a workdir), a directory that refuses prepare's
writes (EPERM: an immutable one) and two prepares into one output (the second refused, naming the first). Each
through the real command."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from runs import ROOT, assert_one_line_error, run_rows, script_env
from transformer_jax.data import PreparedCorpus

SMOKE = str(ROOT / "configs" / "smoke.py")


@pytest.fixture
def nowhere(tmp_path):
    """A workdir and an output no row may make (each fails at its command line)."""
    yield {"workdir": f"--workdir={tmp_path / 'run'}", "output": f"--output={tmp_path / 'corpus'}"}
    assert not os.listdir(tmp_path)


def test_a_command_line_fault_names_it_and_a_flag_the_command_has(nowhere, tmp_path):
    """An unknown key is "unknown key" with the key most likely meant, whichever part is wrong; a missing --config is
    one line naming it (and what it takes), not absl's `flag --config=None`."""
    rows = [
        (["train", f"--config={SMOKE}", nowhere["workdir"], "--config.training.warmup=5"],
         ["unknown key --config.training.warmup (did you mean --config.training.warmup_steps=5?)",
          "--config_help lists every key"]),
        (["train", f"--config={SMOKE}", nowhere["workdir"], "--config.trainin.warmup_steps=5"],
         ["unknown key --config.trainin.warmup_steps (did you mean --config.training.warmup_steps=5?)"]),
        (["train", f"--config={SMOKE}", nowhere["workdir"], "--config.warmup_steps=5"],
         ["unknown key --config.warmup_steps (did you mean --config.training.warmup_steps=5?)"]),
        (["train", f"--config={SMOKE}", nowhere["workdir"], "--config.data.seed=3"],
         ["unknown key --config.data.seed (did you mean --config.training.seed=3?)"]),
        (["prepare", f"--config={SMOKE}", nowhere["output"], "--config.data.vocab=300"],
         ["unknown key --config.data.vocab (did you mean --config.data.vocab_size=300?)"]),
        (["train", f"--config={SMOKE}", nowhere["workdir"], "--config.training.warmup_steps.x=5"],
         ["--config.training.warmup_steps.x: training.warmup_steps is a setting, not a section of settings",
          "pass --config.training.warmup_steps=VALUE"]),
        (["train", f"--config={SMOKE}", nowhere["workdir"], "--config.training.zzqqxx=1"],
         ["unknown key --config.training.zzqqxx; --config_help lists every key"]),
        (["train", nowhere["workdir"]],
         ["--config is required: a config file, or the name of one that ships with the package (demo,", "see --help"]),
        (["train"], ["--config and --workdir are required (--config: a config file"]),
        (["prepare", nowhere["output"]], ["--config is required: a config file"]),
        (["train", "--config=", nowhere["workdir"]], ["--config is empty; pass a config file, or the name of one"]),
        (["train", nowhere["workdir"], "--config.training.warmup_steps=5"],
         ["--config is required: the --config.KEY overrides change its settings"]),
    ]
    (tmp_path / "rows").mkdir()
    results = run_rows("transformer-jax", [args for args, _ in rows], tmp_path / "rows")
    shutil.rmtree(tmp_path / "rows")
    for (args, fragments), result in zip(rows, results):
        line = assert_one_line_error(result, *fragments)
        assert "invalid command line" not in line and "None" not in line, (args, line)
        assert ("did you mean" in line) == ("zzqqxx" not in line and "unknown key" in line), line


def test_prepare_advises_its_own_output_flag(script_trained_run, tmp_path):
    """A corpus prepared with other settings than the command line's: set them back, or choose another --output
    (prepare has no workdir to advise)."""
    corpus = shutil.copytree(script_trained_run["workdir"] / "corpus", tmp_path / "corpus")
    rows = [(["--config.training.seed=4"], ["training.seed=4 differs from the 0 that", "set --config.training.seed=0, "
                                                                                     "or choose another --output"]),
            (["--config.data.vocab_size=300"], ["data.vocab_size=300 differs from the 500",
                                                "or choose another --output"])]
    results = run_rows("transformer-jax", [["prepare", f"--config={SMOKE}", f"--output={corpus}", *flags]
                                           for flags, _ in rows], tmp_path)
    for (_, fragments), result in zip(rows, results):
        assert "workdir" not in assert_one_line_error(result, *fragments)


def test_a_directory_that_refuses_prepares_writes_is_one_storage_line(tmp_path):
    """EPERM from an immutable directory (chattr +i): the output in it, and the directory itself."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a file system with attributes")
    (tmp_path / "rows").mkdir()
    try:
        results = run_rows("transformer-jax", [["prepare", f"--config={SMOKE}", f"--output={output}"]
                                               for output in (locked / "corpus", locked)], tmp_path / "rows")
        left = os.listdir(locked)
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    # The line of the write refused first: the lock's beside the output, or the output's own.
    for output, result in zip((locked / "corpus", locked), results):
        line = assert_one_line_error(result, "failed: operation not permitted", f"make {locked} writable",
                                     "run the same command again")
        assert str(output) in line, line
    assert left == []
    assert sorted(os.listdir(tmp_path)) == ["locked", "rows"]  # no lock left beside the outputs


def test_two_prepares_into_one_output_the_second_is_refused_naming_the_first(tmp_path):
    """The first holds the output's claim (it is stopped with SIGSTOP once it has it, so the second certainly meets
    it); the second is refused in one line naming the first's host and pid and what to do, and touches nothing; the
    first, continued, prepares a whole corpus and releases its claim."""
    import socket

    output, lock = tmp_path / "corpus", tmp_path / "corpus.lock"
    prepare = [sys.executable, "-m", "transformer_jax", "prepare", f"--config={SMOKE}", f"--output={output}"]
    first = subprocess.Popen(prepare, cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.stat().st_size) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)
        try:
            assert json.loads(lock.read_text())["pid"] == first.pid
            listing = sorted(os.listdir(tmp_path))
            second = subprocess.run(prepare, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
            assert sorted(os.listdir(tmp_path)) == listing
        finally:
            first.send_signal(signal.SIGCONT)
        assert_one_line_error(second, f"output {output} is in use by another job preparing a corpus",
                              f"host {socket.gethostname()}, pid {first.pid}",
                              "wait for it to finish or stop it, or choose another --output",
                              f"if that job is gone, delete {lock}")
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0 and "prepared 600 training pairs" in stdout, stderr[-3000:]
    assert not lock.exists() and len(PreparedCorpus.open(str(output))) == 600
