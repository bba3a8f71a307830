"""A catalogue of damaged or mistyped run directories given to train.py, and what a reader of a run leaves alone.

Every row, run as the real command line, expects exit status 2, exactly one `error: ...` line naming the file
and its repair, no traceback, and the damaged workdir left as it was, byte for byte and folder for folder (the
refusal comes before anything is written: base.workdir.check_layout, the logs' check, the lock's own). The
rows run in one process (runs.run_rows), eval.py's command line on a damaged run after them.
"""

import json
import logging
import pathlib
import shutil

import pytest

from runs import assert_one_line_error, copy_run, run_rows, snapshot
from transformer_jax.cli.old_forms import eval_command
from transformer_jax.checkpoints.manager import Checkpointer

# Bytes no UTF-8 text holds, across several lines: as a bad disk or a stray `cat` leaves them.
GARBAGE = b"\xff\xfe\x00garbage\n\x80\x81\n\xc3"


def append(path: pathlib.Path, content: bytes) -> None:
    with open(path, "ab") as file:
        file.write(content)


def replace_line(path: pathlib.Path, number: int, content: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[number - 1] = content
    path.write_bytes(b"\n".join(lines))


def edit_json(path: pathlib.Path, change) -> None:
    """Rewrite the JSON file at `path` as `change(its content)` returns it."""
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def file_for_folder(workdir: pathlib.Path, name: str) -> None:
    shutil.rmtree(workdir / name, ignore_errors=True)
    (workdir / name).write_text("not a folder")


def folder_for_file(workdir: pathlib.Path, name: str) -> None:
    (workdir / name).unlink()
    (workdir / name).mkdir()


# (row, how the copy of the trained run is damaged, fragments of the error line: the file, then the repair)
ROWS = [
    ("garbage appended to metrics.jsonl", lambda w: append(w / "metrics.jsonl", GARBAGE),
     ["metrics.jsonl is damaged: line 9 is not a JSON record (byte 0xff at column 1 is not UTF-8 text)",
      "delete that line and any damaged ones after it, or restore the file"]),
    ("a line of timing.jsonl overwritten", lambda w: replace_line(w / "timing.jsonl", 3, b"x" * 40),
     ["timing.jsonl is damaged: line 3 is not a JSON record (Expecting value at column 1)", "delete that line"]),
    ("a metrics record without its step", lambda w: replace_line(w / "metrics.jsonl", 2, b'{"loss": 1.0}'),
     ["metrics.jsonl is damaged: line 2 is not a JSON record (no integer step)"]),
    ("checkpoints is a file", lambda w: file_for_folder(w, "checkpoints"),
     ["/checkpoints is a file, but a run keeps its checkpoints in a directory of that name", "move it away"]),
    ("tensorboard is a file", lambda w: file_for_folder(w, "tensorboard"),
     ["/tensorboard is a file, but a run keeps its TensorBoard events in a directory", "move it away"]),
    ("plots is a file", lambda w: file_for_folder(w, "plots"),
     ["/plots is a file, but a run keeps its figures in a directory", "move it away"]),
    ("eval is a file", lambda w: file_for_folder(w, "eval"),
     ["/eval is a file, but a run keeps its evaluations in a directory", "move it away"]),
    ("corpus is a file", lambda w: file_for_folder(w, "corpus"),
     ["/corpus is a file, but a run keeps its prepared corpus in a directory", "move it away"]),
    ("metrics.jsonl is a directory", lambda w: folder_for_file(w, "metrics.jsonl"),
     ["/metrics.jsonl is a directory, but a run keeps its metrics in a file", "move it away"]),
    ("config.json is a directory", lambda w: folder_for_file(w, "config.json"),
     ["/config.json is a directory, but a run keeps its settings in a file", "move it away"]),
    ("corpus/manifest.json is a directory", lambda w: folder_for_file(w, "corpus/manifest.json"),
     ["corpus/manifest.json is a directory, but a prepared corpus keeps a file of that name", "move it away",
      "the corpus is prepared again if its manifest.json is missing"]),
    ("run.lock is a directory", lambda w: (w / "run.lock").mkdir(),
     ["/run.lock is not a file, but a job keeps its lock in a file of that name", "move it away"]),
    ("garbage appended to timing.jsonl", lambda w: append(w / "timing.jsonl", GARBAGE),
     ["timing.jsonl is damaged: line", "is not a JSON record (byte 0xff", "delete that line"]),
    # The dev and test splits are checked when the run starts, not when they are first translated or scored.
    ("a dev pair with one side", lambda w: (w / "corpus" / "dev.json").write_text('[["a"]]'),
     ['corpus/dev.json is damaged (pair 1 is ["a"], not [source, target] texts)', "prepare it again"]),
    ("a dev pair of numbers", lambda w: (w / "corpus" / "dev.json").write_text("[[1, 2]]"),
     ["corpus/dev.json is damaged (pair 1 is [1, 2], not [source, target] texts)", "prepare it again"]),
    ("an empty test split", lambda w: (w / "corpus" / "test.json").write_text("[]"),
     ["corpus/test.json is damaged (it holds no pairs)", "prepare it again"]),
    # A well-formed data position of another seed is a changed config, not a damaged checkpoint.
    ("the data position of another seed", lambda w: edit_json(w / "checkpoints/6/data/metadata",
                                                              lambda d: {**d, "seed": 1}),
     ["training.seed=0 differs from the 1 the run's data position was saved with", "--config.training.seed=1"]),
]

# (row, how the newest checkpoint's data-iterator or meta record is damaged, what the warning names): the
# checkpoint is set aside with one warning line and the run resumes from the one before.
DAMAGED_RECORDS = [
    ("data record without its fields", lambda w: (w / "checkpoints/6/data/metadata").write_text('{"seed": 0}'),
     "its data-iterator record is malformed (epoch is null, not a count)"),
    ("data record a list", lambda w: (w / "checkpoints/6/data/metadata").write_text("[]"),
     "its data record is a JSON list, not an object"),
    ("data position not a number", lambda w: edit_json(w / "checkpoints/6/data/metadata",
                                                      lambda d: {**d, "position": "x"}),
     'its data-iterator record is malformed (position is "x", not a count)'),
    ("a file where the checkpoint belongs", lambda w: file_for_folder(w, "checkpoints/6"),
     "checkpoints/6 is a file, not a checkpoint directory"),
    ("open window garbage", lambda w: edit_json(w / "checkpoints/6/meta/metadata",
                                               lambda m: {**m, "open_window": "garbage"}),
     "its meta record is malformed (open_window is a JSON str, not a list of step metrics)"),
]


def tree(directory: pathlib.Path) -> tuple[dict[str, str], list[str]]:
    """Every file's bytes (as snapshot) and every folder's name under `directory`."""
    return snapshot(directory), sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_dir())


@pytest.fixture(scope="module")
def results(tmp_path_factory, trained_run):
    """Each ROWS command on its damaged copy, the copies before and after; then the damaged records' resumes, a
    diverging run, one crash-cut log that resumes, a run without its metrics log, and eval.py on a run with a file
    where its newest checkpoint belongs."""
    directory = tmp_path_factory.mktemp("damaged_runs")
    workdirs = []
    for index, (_, damage, _) in enumerate(ROWS):
        workdirs.append(copy_run(trained_run, directory / f"run{index}"))
        damage(workdirs[-1])
    cut = copy_run(trained_run, directory / "cut")  # as a crash writing step 5's record leaves it
    shutil.rmtree(cut / "checkpoints" / "6")
    lines = (cut / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if b'"step": 5,' not in line and b'"step": 6,' not in line]
    (cut / "metrics.jsonl").write_bytes(b"".join(kept) + lines[len(kept)][:30])
    before = [tree(workdir) for workdir in workdirs]
    damaged = []
    for index, (_, damage, _) in enumerate(DAMAGED_RECORDS):
        damaged.append(copy_run(trained_run, directory / f"record{index}"))
        damage(damaged[-1])
    command_lines = [[f"--config={trained_run['config']}", f"--workdir={workdir}",
                      "--config.training.num_train_steps=8"] for workdir in workdirs + damaged]
    # Step 1's update leaves huge (finite) parameters, every later one is skipped: no final state to score.
    command_lines.append([f"--config={trained_run['config']}", f"--workdir={directory / 'diverged'}",
                          "--config.training.learning_rate_scale=1e10"])
    command_lines.append([f"--config={trained_run['config']}", f"--workdir={cut}"])
    unlogged = copy_run(trained_run, directory / "unlogged")
    (unlogged / "metrics.jsonl").unlink()
    command_lines.append([f"--config={trained_run['config']}", f"--workdir={unlogged}",
                          "--config.training.num_train_steps=8"])
    # eval.py on a run whose newest checkpoint's place holds a file, as eval.py hands it to its command.
    evaluated = copy_run(trained_run, directory / "evaluated")
    file_for_folder(evaluated, "checkpoints/6")
    evaluated_before = tree(evaluated)
    name, argv = eval_command(["eval.py", f"--workdir={evaluated}", "--mode=greedy"])
    # Each row names its command (`transformer-jax train`, what train.py runs, then eval.py's), in one process.
    done = run_rows("transformer-jax", [["train", *line] for line in command_lines] + [[name, *argv[1:]]], directory)
    evaluated_result = done.pop()
    unlogged_result = done.pop()
    return {"rows": dict(zip([row[0] for row in ROWS], done)), "resumed": done[-1], "cut": cut,
            "unlogged": (unlogged_result, unlogged),
            "evaluated": (evaluated_result, evaluated, evaluated_before),
            "records": dict(zip([row[0] for row in DAMAGED_RECORDS], done[len(ROWS):])), "diverged": done[-2],
            "before": dict(zip([row[0] for row in ROWS], before)),
            "after": dict(zip([row[0] for row in ROWS], [tree(workdir) for workdir in workdirs]))}


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_train_py_refuses_a_damaged_run_with_one_line_and_changes_nothing(results, row):
    name, _, fragments = row
    assert_one_line_error(results["rows"][name], *fragments)
    assert "Exception" not in results["rows"][name].stderr
    assert results["after"][name] == results["before"][name]


@pytest.mark.parametrize("row", DAMAGED_RECORDS, ids=[row[0] for row in DAMAGED_RECORDS])
def test_a_damaged_data_or_meta_record_sets_the_checkpoint_aside_and_resumes_from_the_one_before(results, row):
    name, _, problem = row
    resumed = results["records"][name]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr and "error:" not in resumed.stderr, resumed.stderr[-3000:]
    about_it = [line for line in resumed.stderr.splitlines() if "checkpoints/6" in line]
    assert len(about_it) == 1, resumed.stderr[-3000:]
    assert problem in about_it[0] and "checkpoints.corrupt/6" in about_it[0], about_it[0]
    assert "resuming from step 4" in about_it[0], about_it[0]


def test_a_run_whose_last_updates_were_skipped_stops_with_one_line_and_no_score(results):
    diverged = results["diverged"]
    assert_one_line_error(diverged, "the last 5 of 6 updates had a non-finite loss or gradient and were skipped",
                          "(no checkpoint was written)", "lower training.learning_rate_scale")
    assert "SacreBLEU" not in diverged.stdout + diverged.stderr


def test_a_log_line_cut_short_by_a_crash_is_dropped_and_the_resume_writes_it_again(results, trained_run):
    resumed = results["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (results["cut"] / "metrics.jsonl").read_bytes() == (trained_run["workdir"] / "metrics.jsonl").read_bytes()


def test_reading_a_run_changes_nothing_and_warns_about_nothing(trained_run, tmp_path, caplog):
    workdir = copy_run(trained_run, tmp_path / "run")
    (workdir / "checkpoints" / "8.orbax-checkpoint-tmp-1234").mkdir()  # a save the writer has under way
    before = tree(workdir)
    with caplog.at_level(logging.INFO):
        reader = Checkpointer(str(workdir / "checkpoints"), read_only=True)
        assert reader.steps() == [4, 6]
        reader.restore_params(6)
        with pytest.raises(RuntimeError, match="read-only"):
            reader.save(8, None, {}, {})
        reader.close()
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.text
    assert tree(workdir) == before


def test_eval_py_on_a_file_where_the_newest_checkpoint_belongs_names_it(results):
    result, workdir, before = results["evaluated"]  # a copy of the run with a file at checkpoints/6
    assert_one_line_error(result, "checkpoints/6 is a file, not a checkpoint directory",
                          "choose another with --checkpoint=STEP")
    assert tree(workdir) == before


def test_a_missing_metrics_log_is_one_warning_and_the_log_goes_on(results):
    resumed, workdir = results["unlogged"]
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    [line] = [line for line in resumed.stderr.splitlines() if "metrics.jsonl" in line]
    assert "is missing: the records of steps 1 to 6 are lost" in line, line
    steps = [json.loads(record)["step"] for record in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps and min(steps) == 7 and max(steps) == 8, steps
