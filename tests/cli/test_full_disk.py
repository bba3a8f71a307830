"""train.py on a disk that fills up, or a workdir removed, while it runs: one line, nothing lost, the same command
resumes.

A full disk (a real small tmpfs, runs.small_disk) must give exit status 2 and exactly one `error: ...` line
naming what was being written, the checkpoint kept and what to do, with no traceback from any thread; the
newest complete checkpoint stays, the log holds no part of a line, and once space is freed the same
command finishes with a metrics.jsonl byte-identical to an uninterrupted run's.
"""

import json
import pathlib
import shutil
import subprocess
import time

from runs import assert_one_line_error, copy_run, fill, run_script, small_disk, snapshot, start_script

LOGS = ("metrics.jsonl", "timing.jsonl", "tensorboard")


def train(config: str, workdir: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return run_script("train.py", f"--config={config}", f"--workdir={workdir}", *flags)


def assert_quiet(result: subprocess.CompletedProcess) -> None:
    """No thread printed a traceback, and no abandoned write did at exit."""
    for sign in ("Traceback", "Exception in thread", "Exception ignored", "never awaited"):
        assert sign not in result.stderr, result.stderr[-3000:]


def whole_lines(path: pathlib.Path) -> list[dict]:
    """The records of a log, asserting that it ends with a whole line."""
    content = path.read_text()
    assert content.endswith("\n"), content[-300:]
    return [json.loads(line) for line in content.splitlines()]


def test_a_full_disk_during_a_checkpoint_save_keeps_the_last_one_and_the_same_command_resumes(trained_run, tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        workdir = copy_run(trained_run, disk / "run")
        shutil.rmtree(workdir / "checkpoints" / "6")  # the run resumes from step 4 and saves step 6 again
        kept = snapshot(workdir / "checkpoints" / "4")
        fill(disk, leave=100_000)  # room for the logs, not for a checkpoint (~650 KB)
        result = train(trained_run["config"], workdir)
        assert_one_line_error(result, f"writing checkpoint step 6 to {workdir}/checkpoints",
                              "no space left on the device", "checkpoint step 4 is kept; free space and run the same "
                              "command again: it resumes from step 4")
        assert_quiet(result)
        assert snapshot(workdir / "checkpoints" / "4") == kept
        assert [p.name for p in (workdir / "checkpoints").iterdir() if "tmp" not in p.name] == ["4"]
        whole_lines(workdir / "metrics.jsonl")

        (disk / ".filler").unlink()
        again = train(trained_run["config"], workdir)
        assert again.returncode == 0, again.stderr[-3000:]
        assert (workdir / "metrics.jsonl").read_bytes() == (trained_run["workdir"] / "metrics.jsonl").read_bytes()
        assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4", "6"]  # the unfinished save is gone


def test_a_full_disk_while_logging_leaves_whole_lines_and_the_same_command_resumes(trained_run, tmp_path):
    # No checkpoint between step 6 and the end: the disk fills up with log lines first.
    flags = ("--config.training.num_train_steps=60", "--config.training.checkpoint_every=1000",
             "--config.training.eval_every=0")
    reference = train(trained_run["config"], copy_run(trained_run, tmp_path / "reference"), *flags)
    assert reference.returncode == 0, reference.stderr[-3000:]
    with small_disk(tmp_path / "disk", "8m") as disk:
        workdir = copy_run(trained_run, disk / "run")
        fill(disk, leave=24_576)
        result = train(trained_run["config"], workdir, *flags)
        line = assert_one_line_error(result, "failed: no space left on the device", "checkpoint step 6 is kept; free "
                                     "space and run the same command again: it resumes from step 6")
        assert any(f"({workdir}/{name})" in line for name in LOGS), line
        assert_quiet(result)
        assert max(record["step"] for record in whole_lines(workdir / "metrics.jsonl")) > 6  # it failed while logging
        whole_lines(workdir / "timing.jsonl")

        (disk / ".filler").unlink()
        again = train(trained_run["config"], workdir, *flags)
        assert again.returncode == 0, again.stderr[-3000:]
        assert (workdir / "metrics.jsonl").read_bytes() == (tmp_path / "reference" / "metrics.jsonl").read_bytes()


def test_a_full_disk_while_preparing_a_new_run_and_the_same_command_then_trains_it(trained_run, tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        fill(disk, leave=300_000)  # room for the tokenizer, not for the rest of the corpus
        result = train(trained_run["config"], disk / "run")
        assert_one_line_error(result, "no space left on the device", "free space and run the same command again")
        assert_quiet(result)

        (disk / ".filler").unlink()
        again = train(trained_run["config"], disk / "run")
        assert again.returncode == 0, again.stderr[-3000:]
        assert (disk / "run" / "metrics.jsonl").read_bytes() == (trained_run["workdir"] / "metrics.jsonl").read_bytes()


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
