"""Crash and resume, nothing lost; and determinism: train.py killed with SIGKILL and restarted, compared
with an uninterrupted run, and reruns with the same and another seed (CPU)."""

import json
import pathlib
import random
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
from runs import NO_TEST_TRANSLATION, run_script, start_script, write_config

from transformer_jax.checkpoints.manager import Checkpointer

STEPS = 12
KEEP = 2
# A checkpoint at every step, so a random kill often lands while an asynchronous save is being written.
SETTINGS = (f"--config.training.num_train_steps={STEPS}", "--config.training.checkpoint_every=1",
            f"--config.training.keep_checkpoints={KEEP}")


def train(config: str, workdir: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    result = run_script("train.py", f"--config={config}", f"--workdir={workdir}", *SETTINGS, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def unfinished_saves(workdir: pathlib.Path) -> list[str]:
    directory = workdir / "checkpoints"
    return [p.name for p in directory.iterdir() if "tmp" in p.name] if directory.exists() else []


def last_logged_step(workdir: pathlib.Path) -> int:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]
    return max(steps, default=0)


def start_and_kill(config: str, workdir: pathlib.Path, kill_when, deadline: float = 240) -> bool:
    """Start train.py, SIGKILL it as soon as `kill_when()` holds; True when it died with a save unfinished."""
    process = start_script("train.py", f"--config={config}", f"--workdir={workdir}", *SETTINGS)
    give_up = time.time() + deadline
    while not kill_when() and process.poll() is None and time.time() < give_up:
        time.sleep(0.001)
    assert process.poll() is None, "the run ended before the kill point: " + process.communicate()[1][-2000:]
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    return bool(unfinished_saves(workdir))


def params_of(workdir: pathlib.Path) -> list[np.ndarray]:
    checkpointer = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    return [np.asarray(x) for x in jax.tree.leaves(checkpointer.restore_params(checkpointer.latest_step()))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of STEPS steps (seed 0), its packed rows' width chosen from the corpus as configs/smoke.py's
    (two batch shapes: each resume finds its place among batches of both)."""
    directory = tmp_path_factory.mktemp("crash")
    config = write_config(directory, automatic_row_width=True)
    train(config, directory / "uninterrupted")
    return config, directory / "uninterrupted"


def test_sigkill_at_random_points_then_resume_loses_nothing(reference, tmp_path):
    config, uninterrupted = reference
    workdir = tmp_path / "killed"
    chooser = random.Random(20261121)  # fixed: the same kill points every time the test runs
    saving_at = chooser.randint(2, 4)
    logged_at = chooser.randint(saving_at + 1, saving_at + 3)
    startup_after = chooser.uniform(0.5, 3.0)
    late_saving_at = chooser.randint(logged_at + 2, STEPS - 2)
    mid_save = [
        # 1. while the asynchronous checkpoint of step `saving_at` (or later) is being written;
        start_and_kill(config, workdir, lambda: any(int(name.split(".")[0]) >= saving_at
                                                    for name in unfinished_saves(workdir))),
    ]
    # 2. at a random moment between saves, shortly after step `logged_at` is logged;
    pause = chooser.uniform(0.0, 0.2)
    logged = []
    start_and_kill(config, workdir, lambda: last_logged_step(workdir) >= logged_at and (
        logged.append(time.time()) or time.time() - logged[0] >= pause))
    # 3. during start-up (reading the data, restoring, compiling);
    started = time.time()
    start_and_kill(config, workdir, lambda: time.time() - started >= startup_after)
    # 4. while a later save is being written.
    mid_save.append(start_and_kill(config, workdir, lambda: any(
        int(name.split(".")[0]) >= late_saving_at for name in unfinished_saves(workdir))))
    assert any(mid_save), "no kill landed while a checkpoint was being written"
    train(config, workdir)

    assert (workdir / "metrics.jsonl").read_bytes() == (uninterrupted / "metrics.jsonl").read_bytes()
    for a, b in zip(params_of(workdir), params_of(uninterrupted), strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.loads((workdir / "test_final.json").read_text()) == json.loads(
        (uninterrupted / "test_final.json").read_text())
    # Unfinished saves were cleaned up, nothing was taken for damaged, and only the last KEEP
    # checkpoints (plus the best by dev loss) take disk space.
    assert not unfinished_saves(workdir) and not (workdir / "checkpoints.corrupt").exists()
    steps = Checkpointer(str(workdir / "checkpoints"), read_only=True).steps()
    assert steps[-KEEP:] == list(range(STEPS - KEEP + 1, STEPS + 1)) and len(steps) <= KEEP + 1
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == sorted(map(str, steps))


def test_same_seed_gives_identical_metrics_and_another_seed_does_not(reference, tmp_path):
    config, uninterrupted = reference
    train(config, tmp_path / "again", NO_TEST_TRANSLATION)
    assert (tmp_path / "again" / "metrics.jsonl").read_bytes() == (uninterrupted / "metrics.jsonl").read_bytes()
    train(config, tmp_path / "seed1", "--config.training.seed=1", NO_TEST_TRANSLATION)
    first = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    other = [json.loads(line) for line in (tmp_path / "seed1" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in other] == [(r["step"], r["split"]) for r in first]
    assert all(a["loss"] != b["loss"] for a, b in zip(first, other))
