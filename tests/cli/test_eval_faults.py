"""A catalogue of faults around eval.py (and train.py's end): a full or read-only disk, outputs whose place is
wrong, standard input that is not text, a damaged tokenizer model.

Every row, run as the real command line, expects exit status 2, exactly one `error: ...` line naming the
thing and the fix, no traceback, and the files it must not touch byte for byte as they were. A row whose
disk was full prints its score first, leaves no partial output, and the same command succeeds once space
is freed. The eval.py rows run in one process (runs.run_rows), their disks and damaged copies made first, and
train.py's rows after them in the same process; the retries once space is freed, in a second one.
"""

import json
import pathlib
import shutil
import subprocess

import pytest

from runs import (
    ROOT,
    assert_one_line_error,
    command,
    copy_run,
    fill,
    run_rows,
    script_env,
    small_disk,
    snapshot,
)
from transformer_jax.cli.old_forms import eval_command

CTRANSLATE2 = "ctranslate2:"


def damaged_copies(trained_run: dict, directory: pathlib.Path) -> dict:
    """Copies of the trained run, each with one part broken, and a regular file to write under."""
    runs = {name: copy_run(trained_run, directory / name)
            for name in ("run", "cut_tokenizer", "cut_both_tokenizers", "tokenizer_folder", "files_for_folders",
                         "tensorboard_file")}
    model = (runs["run"] / "tokenizer.model").read_bytes()
    (runs["cut_tokenizer"] / "tokenizer.model").write_bytes(model[:1000])  # as `head -c 1000` leaves it
    for path in ("tokenizer.model", "corpus/tokenizer.model"):
        (runs["cut_both_tokenizers"] / path).write_bytes(model[:1000])
    (runs["tokenizer_folder"] / "tokenizer.model").unlink()
    (runs["tokenizer_folder"] / "tokenizer.model").mkdir()
    for name, folder in (("files_for_folders", "plots"), ("tensorboard_file", "tensorboard")):
        shutil.rmtree(runs[name] / folder, ignore_errors=True)
        (runs[name] / folder).write_text("not a folder")
    (runs["files_for_folders"] / "eval").write_text("not a folder")
    (directory / "a_file").write_text("not a directory")
    (directory / "link_to_checkpoints").symlink_to(runs["run"] / "checkpoints")
    return runs


# (row, eval.py flags given the setup (workdir included), fragments of the error line: the thing, then the fix)
EVAL_ROWS = [
    ("full disk: scores", lambda s: [f"--workdir={s['full'] / 'run'}"],
     ["saving the translations and scores printed above", "eval/test.step_6.hyp", "no space left on the device",
      "free space and run the same command again"]),
    ("full disk: export", lambda s: [f"--workdir={s['full'] / 'run'}", f"--export={CTRANSLATE2}{s['full'] / 'ct2'}"],
     ["writing the ctranslate2 model", "/ct2)", "no space left on the device", "run the same command again"]),
    ("full disk: averaged parameters", lambda s: [f"--workdir={s['full'] / 'run'}", "--checkpoint=average:2",
                                                  f"--write_averaged={s['full'] / 'averaged'}"],
     ["writing the averaged parameters", "/averaged)", "no space left on the device", "run the same command again"]),
    ("full disk: figure", lambda s: [f"--workdir={s['full'] / 'run'}", "--plot_positional_encoding"],
     ["writing the figures", "plots/positional_encoding.png", "no space left on the device"]),
    ("read-only disk: scores", lambda s: [f"--workdir={s['readonly'] / 'run'}"],
     ["saving the translations and scores printed above", "read-only file system",
      "readonly/run/eval writable and run the same command again"]),
    ("read-only disk: averaged parameters", lambda s: [f"--workdir={s['readonly'] / 'run'}",
                                                       f"--write_averaged={s['readonly'] / 'averaged'}"],
     ["writing the averaged parameters", "read-only file system", "readonly writable"]),
    ("export under a file", lambda s: [f"--workdir={s['run']}", f"--export={CTRANSLATE2}{s['dir'] / 'a_file' / 'x'}"],
     ["cannot write export directory", "a_file/x (Not a directory", "a_file is a file", "choose another directory"]),
    ("export into the checkpoints", lambda s: [f"--workdir={s['run']}",
                                               f"--export={CTRANSLATE2}{s['run'] / 'checkpoints' / 'ct2'}"],
     ["--output directory", "is inside the run's checkpoints folder", "damaged checkpoint", "choose a path outside"]),
    ("averaged parameters into the checkpoints", lambda s: [f"--workdir={s['run']}",
                                                            f"--write_averaged={s['run'] / 'checkpoints' / '99'}"],
     ["--output path", "checkpoints/99 is inside the run's checkpoints folder", "choose a path outside"]),
    ("averaged parameters into the checkpoints by '..'",
     lambda s: [f"--workdir={s['run']}", f"--write_averaged={s['run'] / 'corpus' / '..' / 'checkpoints' / '99'}"],
     ["is inside the run's checkpoints folder", "choose a path outside"]),
    ("averaged parameters into the checkpoints by a link",
     lambda s: [f"--workdir={s['run']}", f"--write_averaged={s['dir'] / 'link_to_checkpoints' / '99'}"],
     ["link_to_checkpoints/99 is inside the run's checkpoints folder", "choose a path outside"]),
    ("eval folder is a file", lambda s: [f"--workdir={s['files_for_folders']}"],
     ["files_for_folders/eval is a file, but a run keeps its evaluations in a directory", "move it away"]),
    ("plots folder is a file", lambda s: [f"--workdir={s['files_for_folders']}", "--plot_curves"],
     ["files_for_folders/plots is a file, but a run keeps its figures in a directory", "move it away"]),
    ("tensorboard folder is a file", lambda s: [f"--workdir={s['tensorboard_file']}", "--plot_positional_encoding"],
     ["tensorboard_file/tensorboard is a file, but a run keeps its TensorBoard events in a directory",
      "move it away"]),
    ("--translate names a folder", lambda s: [f"--workdir={s['run']}", f"--translate={s['dir']}"],
     ["is a directory", "pass a text file or -"]),
    ("tokenizer model cut short", lambda s: [f"--workdir={s['cut_tokenizer']}"],
     ["cut_tokenizer/tokenizer.model is damaged (SentencePiece cannot read its 1000 bytes)",
      "copy", "cut_tokenizer/corpus/tokenizer.model (an intact copy the run keeps) to"]),
    ("both tokenizer models cut short", lambda s: [f"--workdir={s['cut_both_tokenizers']}"],
     ["cut_both_tokenizers/tokenizer.model is damaged", "restore it from a backup",
      "a retrained tokenizer would not give the same ids"]),
    ("tokenizer model is a folder", lambda s: [f"--workdir={s['tokenizer_folder']}"],
     ["tokenizer_folder/tokenizer.model is a directory, not a file", "remove it, then copy",
      "tokenizer_folder/corpus/tokenizer.model"]),
]


def eval_rows(rows: list[list[str]]) -> list[list[str]]:
    """eval.py command lines as `transformer-jax` rows: each names the command eval.py hands it to."""
    named = [eval_command(["eval.py", *flags]) for flags in rows]
    return [[name, *argv[1:]] for name, argv in named]


def train_faults(trained_run: dict, directory: pathlib.Path, disk: pathlib.Path) -> dict[str, pathlib.Path]:
    """Copies of the trained run for train.py: each tokenizer model cut short, and one on the nearly full `disk`."""
    workdirs = {name: copy_run(trained_run, directory / name) for name in ("cut_tokenizer", "cut_corpus_tokenizer")}
    model = (workdirs["cut_tokenizer"] / "tokenizer.model").read_bytes()
    (workdirs["cut_tokenizer"] / "tokenizer.model").write_bytes(model[:1000])
    (workdirs["cut_corpus_tokenizer"] / "corpus" / "tokenizer.model").write_bytes(model[:1000])
    workdirs["full_disk"] = copy_run(trained_run, disk / "run")
    fill(disk, leave=32 * 1024)  # room for the start (the run lock, a TensorBoard file), not for the figure
    return workdirs


@pytest.fixture(scope="module")
def setup(tmp_path_factory, trained_run):
    """Broken copies of the trained run, one on a full disk and one on a read-only disk; every EVAL_ROWS
    command run on them, then the full disk's commands again after its space was freed. test_train_py_faults's
    train.py command lines run in the same two processes, after the eval.py ones (results under "train")."""
    directory = tmp_path_factory.mktemp("eval_faults")
    setup = {"dir": directory, **damaged_copies(trained_run, directory)}
    with (small_disk(directory / "full", "4m") as full, small_disk(directory / "readonly", "4m") as readonly,
          small_disk(directory / "train" / "disk", "4m") as train_disk):
        copy_run(trained_run, full / "run")
        copy_run(trained_run, readonly / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(readonly)], check=True, capture_output=True)
        fill(full)
        setup.update(full=full, readonly=readonly)
        trains = train_faults(trained_run, directory / "train", train_disk)
        train_lines = [["train", f"--config={trained_run['config']}", f"--workdir={workdir}"]
                       for workdir in trains.values()]
        watched = [full, readonly, *(setup[name] for name in ("run", "files_for_folders", "tensorboard_file"))]
        before = [snapshot(path) for path in watched]
        trains_before = {name: snapshot(workdir) for name, workdir in trains.items()}
        rows = eval_rows([flags(setup) for _, flags, _ in EVAL_ROWS])
        results = run_rows("transformer-jax", rows + train_lines, directory)
        after = [snapshot(path) for path in watched]
        trains_after = {name: snapshot(workdir) for name, workdir in trains.items()}
        saved = [(trains["full_disk"] / name).read_text() for name in ("test_final.hyp", "test_final.json")]
        left = sorted(path.name for path in full.iterdir())  # before the retries
        (full / ".filler").unlink()
        (train_disk / ".filler").unlink()
        retries = run_rows("transformer-jax", rows[:4] + train_lines[2:], directory)
        train = {"results": results[len(rows):], "retry": retries.pop(), "before": trains_before,
                 "after": trains_after, "saved": saved}
        yield {**setup, "results": dict(zip([row[0] for row in EVAL_ROWS], results)), "before": before,
               "after": after, "left": left, "retries": retries, "train": train}


@pytest.mark.parametrize("row", EVAL_ROWS, ids=[row[0] for row in EVAL_ROWS])
def test_eval_py_fault_is_one_line_and_touches_nothing(setup, row):
    name, _, fragments = row
    result = setup["results"][name]
    assert_one_line_error(result, *fragments)
    assert setup["after"] == setup["before"]  # no partial output, no temporary, the runs as they were
    if name.endswith(": scores"):  # the score was worked out: it is printed before the write that failed
        assert "SacreBLEU" in result.stdout and "hypotheses:" not in result.stdout
    else:
        assert result.stdout == ""


def test_a_full_disk_leaves_nothing_that_refuses_the_retry(setup):
    assert setup["left"] == [".filler", "run"]  # no export folder, no averaged checkpoint, no temporaries
    scores, export, averaged, figure = setup["retries"]
    for result in setup["retries"]:
        assert result.returncode == 0, result.stderr[-3000:]
    assert f"hypotheses: {setup['full'] / 'run' / 'eval' / 'test.step_6.hyp'}" in scores.stdout
    assert len((setup["full"] / "run" / "eval" / "test.step_6.hyp").read_text().splitlines()) == 16
    assert {"model.bin", "config.json", "tokenizer.model"} <= {path.name for path in (setup["full"] / "ct2").iterdir()}
    assert (setup["full"] / "averaged").is_dir() and "wrote the parameters of steps [4, 6]" in averaged.stdout
    assert (setup["full"] / "run" / "plots" / "positional_encoding.png").stat().st_size > 0
    assert sorted(path.name for path in (setup["full"] / "run" / "eval").iterdir()) == [
        "test.step_6.hyp", "test.step_6.json"]


# Standard input that is not UTF-8 text, or none at all: (row, stdin bytes or None for closed, fragments).
STDIN_ROWS = [
    ("Latin-1", b"The dog sleeps .\nDer Hund schl\xe4ft .\n",
     ["standard input line 2 is not valid UTF-8 (byte 0xe4)", "re-encode the text as UTF-8"]),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n", ["standard input line 1 is not valid UTF-8 (byte 0x89)"]),
    ("closed", None, ["--input=- reads standard input, but it is closed", "pipe the text in", "or pass a file"]),
]


@pytest.mark.parametrize("row", STDIN_ROWS, ids=[row[0] for row in STDIN_ROWS])
def test_translating_standard_input_that_is_not_text(trained_run, row):
    name, data, fragments = row
    before = snapshot(trained_run["workdir"])
    args = command("eval.py", f"--workdir={trained_run['workdir']}", "--translate=-", "--mode=greedy")
    if data is None:
        args = ["sh", "-c", 'exec "$@" <&-', "sh", *args]  # standard input closed
    result = subprocess.run(args, cwd=ROOT, env=script_env(), input=data, capture_output=True, timeout=300)
    result = subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                         result.stderr.decode(errors="replace"))
    assert_one_line_error(result, *fragments)
    assert snapshot(trained_run["workdir"]) == before
    # Lines before the bad one are translated as they come (one line each; a tiny model's may be empty).
    assert result.stdout.count("\n") == (1 if name == "Latin-1" else 0)


def test_train_py_faults(setup):
    """A damaged tokenizer model (either copy) stops train.py at its start with the fix; a full disk at the end
    of training prints the test scores, then one line, and the same command finishes once space is freed."""
    train = setup["train"]  # its command lines ran in the setup's processes, after the eval.py rows
    cut, cut_corpus, full = train["results"]
    before, after, saved, retry = train["before"], train["after"], train["saved"], train["retry"]
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert "learning curves:" in retry.stdout
    assert_one_line_error(cut, "cut_tokenizer/tokenizer.model is damaged",
                          "cut_tokenizer/corpus/tokenizer.model (an intact copy the run keeps) to")
    assert_one_line_error(cut_corpus, "cut_corpus_tokenizer/corpus/tokenizer.model is damaged",
                          "copy", "cut_corpus_tokenizer/tokenizer.model (an intact copy the run keeps)")
    assert_one_line_error(full, "writing the learning curves", "plots/learning_curves.png",
                          "no space left on the device", "training finished at step 6 (checkpoint saved)",
                          "run the same command again")
    assert "test SacreBLEU" in full.stdout and "learning curves:" not in full.stdout
    assert after["cut_tokenizer"] == before["cut_tokenizer"]
    assert after["cut_corpus_tokenizer"] == before["cut_corpus_tokenizer"]
    # The test translation and scores were saved whole before the figure failed; a resumed run adds a TensorBoard
    # file; nothing else changed, and no temporary is left.
    changed = {path for path in after["full_disk"].keys() ^ before["full_disk"].keys() if
               not path.startswith("tensorboard/")} | {path for path in before["full_disk"] if
                                                        after["full_disk"].get(path) != before["full_disk"][path]}
    assert changed <= {"test_final.hyp", "test_final.json"}, changed
    assert len(saved[0].splitlines()) == 16 and json.loads(saved[1])["step"] == 6


def test_standard_output_on_a_full_device_is_one_line_naming_it(trained_run, tmp_path):
    """`> FILE` on a full disk: the line names standard output, not a file of the run, which is left alone."""
    (tmp_path / "in.txt").write_text("The dog sleeps .\n")
    before = snapshot(trained_run["workdir"])
    for flags in (["--translate=" + str(tmp_path / "in.txt")], ["--write_averaged=" + str(tmp_path / "averaged")]):
        with open("/dev/full", "w") as full:
            result = subprocess.run(command("eval.py", f"--workdir={trained_run['workdir']}", "--mode=greedy", *flags),
                                    cwd=ROOT, env=script_env(), stdout=full, stderr=subprocess.PIPE, text=True,
                                    timeout=300)
        result.stdout = ""
        assert_one_line_error(result, "writing to standard output failed: no space left on the device",
                              "where standard output goes (or redirect it elsewhere)")
    assert snapshot(trained_run["workdir"]) == before
