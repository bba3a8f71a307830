"""train.py on a disk that fills up, or a workdir removed, while it runs: one line, nothing lost, the same command
resumes.

A full disk (a real small tmpfs, runs.small_disk) must give exit status 2 and exactly one `error: ...` line
naming what was being written, the checkpoint kept and what to do, with no traceback from any thread; the
newest complete checkpoint stays, the log holds no part of a line, and once space is freed the same
command finishes with a metrics.jsonl byte-identical to an uninterrupted run's.

Each full disk stops a train.py process of its own; the same commands that then finish the stopped runs (and the
uninterrupted run the logging case compares with) run in one process (runs.run_rows: train.py's own flag parsing and
main, each on its workdir), made once for the module by a fixture that records what each stop left before any rerun
touches it.
"""

import contextlib
import json
import pathlib
import shutil
import subprocess
import time

import pytest

from runs import (NO_TEST_TRANSLATION, assert_one_line_error, copy_run, fill, run_rows, run_script, small_disk,
                  snapshot, start_script)

LOGS = ("metrics.jsonl", "timing.jsonl", "tensorboard")
# Every command of the module, stopped or finishing, runs with NO_TEST_TRANSLATION: no assertion reads a test
# translation, its scores or the plots, and metrics.jsonl (compared below with the trained run's, which has none
# either) holds none of them.
# The logging case: no checkpoint between step 6 and the end, so that the disk fills up with log lines first (with the
# room fill leaves, at about step 22: 40 steps leave as many again to spare).
LOGGING_FLAGS = ("--config.training.num_train_steps=40", "--config.training.checkpoint_every=1000",
                 "--config.training.eval_every=0")


def train(config: str, workdir: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return run_script("train.py", f"--config={config}", f"--workdir={workdir}", NO_TEST_TRANSLATION, *flags)


def assert_quiet(result: subprocess.CompletedProcess) -> None:
    """No thread printed a traceback, and no abandoned write did at exit."""
    for sign in ("Traceback", "Exception in thread", "Exception ignored", "never awaited"):
        assert sign not in result.stderr, result.stderr[-3000:]


def whole_lines(content: str) -> list[dict]:
    """The records of a log's `content`, asserting that it ends with a whole line."""
    assert content.endswith("\n"), content[-300:]
    return [json.loads(line) for line in content.splitlines()]


@pytest.fixture(scope="module")
def full_disks(trained_run, tmp_path_factory):
    """{case: (the run's workdir on its small disk, the stopped run, what it left)} for a full disk while saving a
    checkpoint ("save"), while logging ("logging") and while preparing a new run ("preparing"), each stopped in its own
    process; then, with the space freed, "again": {case: the same command once more} and "reference": the logging
    case's command on an unlimited copy of the run, all in one process. The disks stay mounted for the module."""
    config, directory = trained_run["config"], tmp_path_factory.mktemp("full_disks")
    with contextlib.ExitStack() as disks:
        runs = {}
        disk = disks.enter_context(small_disk(directory / "save", "8m"))
        workdir = copy_run(trained_run, disk / "run")
        shutil.rmtree(workdir / "checkpoints" / "6")  # the run resumes from step 4 and saves step 6 again
        kept = snapshot(workdir / "checkpoints" / "4")
        fill(disk, leave=100_000)  # room for the logs, not for a checkpoint (~650 KB)
        result = train(config, workdir)
        runs["save"] = (workdir, result, {
            "step 4 before": kept, "step 4": snapshot(workdir / "checkpoints" / "4"),
            "checkpoints": [p.name for p in (workdir / "checkpoints").iterdir() if "tmp" not in p.name],
            "metrics.jsonl": (workdir / "metrics.jsonl").read_text()})
        (disk / ".filler").unlink()

        disk = disks.enter_context(small_disk(directory / "logging", "8m"))
        workdir = copy_run(trained_run, disk / "run")
        fill(disk, leave=24_576)
        result = train(config, workdir, *LOGGING_FLAGS)
        runs["logging"] = (workdir, result, {name: (workdir / name).read_text()
                                             for name in ("metrics.jsonl", "timing.jsonl")})
        (disk / ".filler").unlink()

        disk = disks.enter_context(small_disk(directory / "preparing", "8m"))
        fill(disk, leave=300_000)  # room for the tokenizer, not for the rest of the corpus
        runs["preparing"] = (disk / "run", train(config, disk / "run"), {})
        (disk / ".filler").unlink()

        reference = copy_run(trained_run, directory / "reference")
        rows = {"reference": [f"--config={config}", f"--workdir={reference}", NO_TEST_TRANSLATION, *LOGGING_FLAGS],
                "save": [f"--config={config}", f"--workdir={runs['save'][0]}", NO_TEST_TRANSLATION],
                "logging": [f"--config={config}", f"--workdir={runs['logging'][0]}", NO_TEST_TRANSLATION,
                            *LOGGING_FLAGS],
                "preparing": [f"--config={config}", f"--workdir={runs['preparing'][0]}", NO_TEST_TRANSLATION]}
        results = dict(zip(rows, run_rows("train.py", list(rows.values()), directory)))
        yield {**runs, "again": results, "reference": (reference, results["reference"])}


def test_a_full_disk_during_a_checkpoint_save_keeps_the_last_one_and_the_same_command_resumes(trained_run, full_disks):
    workdir, result, left = full_disks["save"]
    assert_one_line_error(result, f"writing checkpoint step 6 to {workdir}/checkpoints",
                          "no space left on the device", "checkpoint step 4 is kept; free space and run the same "
                          "command again: it resumes from step 4")
    assert_quiet(result)
    assert left["step 4"] == left["step 4 before"]
    assert left["checkpoints"] == ["4"]
    whole_lines(left["metrics.jsonl"])

    again = full_disks["again"]["save"]  # the space freed
    assert again.returncode == 0, again.stderr[-3000:]
    assert (workdir / "metrics.jsonl").read_bytes() == (trained_run["workdir"] / "metrics.jsonl").read_bytes()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4", "6"]  # the unfinished save is gone


def test_a_full_disk_while_logging_leaves_whole_lines_and_the_same_command_resumes(full_disks):
    reference, uninterrupted = full_disks["reference"]
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    workdir, result, left = full_disks["logging"]
    line = assert_one_line_error(result, "failed: no space left on the device", "checkpoint step 6 is kept; free "
                                 "space and run the same command again: it resumes from step 6")
    assert any(f"({workdir}/{name})" in line for name in LOGS), line
    assert_quiet(result)
    assert max(record["step"] for record in whole_lines(left["metrics.jsonl"])) > 6  # it failed while logging
    whole_lines(left["timing.jsonl"])

    again = full_disks["again"]["logging"]  # the space freed
    assert again.returncode == 0, again.stderr[-3000:]
    assert (workdir / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()


def test_a_full_disk_while_preparing_a_new_run_and_the_same_command_then_trains_it(trained_run, full_disks):
    workdir, result, _ = full_disks["preparing"]
    assert_one_line_error(result, "no space left on the device", "free space and run the same command again")
    assert_quiet(result)

    again = full_disks["again"]["preparing"]  # the space freed
    assert again.returncode == 0, again.stderr[-3000:]
    assert (workdir / "metrics.jsonl").read_bytes() == (trained_run["workdir"] / "metrics.jsonl").read_bytes()


def test_the_workdir_removed_under_a_run_is_one_line(trained_run, tmp_path):
    workdir = copy_run(trained_run, tmp_path / "run")
    process = start_script("train.py", f"--config={trained_run['config']}", f"--workdir={workdir}",
                           "--config.training.num_train_steps=5000")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and process.poll() is None:
            metrics = workdir / "metrics.jsonl"
            if metrics.exists() and '"step": 12,' in metrics.read_text():
                break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()[1][-3000:]
        shutil.rmtree(workdir, ignore_errors=True)  # as `rm -rf`: the run may write into it meanwhile
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert_one_line_error(result, f"workdir {workdir} vanished while the run was writing it",
                          "restore it and run the same command again to resume")
    assert_quiet(result)
