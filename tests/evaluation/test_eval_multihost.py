"""eval.py --multihost: 2 processes x 2 CPU devices evaluate a run as 1 process with 4 devices does.

A tiny run is trained once. eval.py then scores its test split with the average of its last two
checkpoints, translates a file and writes the averaged parameters, once as one process with 4 CPU devices
and once as two processes of 2 devices each joined by jax.distributed (gloo collectives on CPU). The
one-process references of the three commands run once, one after the other in one process (tests/cli_rows.py:
each command line through eval.py's own flag parsing and main, as a separate eval.py would run it), which
saves two starts of Python and JAX; every two-process eval.py is a process of its own, as a user starts it.
Every eval.py runs under an audit hook (HOOK) that records which paths it opens for writing, renames or
creates inside the workdir (for the references, command by command), so the test sees which process wrote
what, not only the files that resulted.

On CPU, XLA's gloo collectives print "[Gloo] Rank i is connected to ..." from native code when they
connect; a joined process sends that to standard error, so standard output holds only what eval.py prints.
"""

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from runs import (DEFAULT_EMITTER_FLAGS, NO_TEST_TRANSLATION, ROOT, cpu_xla_flags, finish_all, free_port, run_script,
                  script_env, write_config)

# Long enough (with a steeper schedule than configs/smoke.py) that the hypotheses are not empty lines
# and their lengths differ from sentence to sentence: a misplaced row would change the .hyp file. No test translation
# at the end of training (NO_TEST_TRANSLATION): the tests score the test split with eval.py.
TRAINING = ("--config.training.num_train_steps=200", "--config.training.checkpoint_every=100",
            "--config.training.eval_every=1000", "--config.training.warmup_steps=30",
            "--config.training.learning_rate_scale=2", "--config.training.label_smoothing=0",
            "--config.model.dropout_rate=0", NO_TEST_TRANSLATION)
EVALUATION = ("--checkpoint=average:2",)
# 10 lines (not a multiple of the 4 devices) of many lengths, one empty.
SENTENCES = ["The dog sleeps.", "This is the house that we will build together in the spring.", "Yes.",
             "We must take the train before the meeting ends.", "A cat", "",
             "Blootroft blits lehairk the heaft with a meapret.", "They sing", "Where is the old bridge now?",
             "Tero must fregrosk that the vunt does not fud the joskeams before froskir trojan beglesks must skeap it."]

# Records the paths inside `workdir` that this process opens for writing, renames to, removes or creates as a
# directory into `written` (Python's file operations; Orbax writes array data from C++, which the test checks by
# the files it finds).
HOOK = textwrap.dedent(
    """
    import atexit, json, os, runpy, sys
    written = []
    WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path):
        if isinstance(path, (str, bytes)):
            path = os.path.abspath(os.fsdecode(path))
            if path == workdir or path.startswith(workdir + os.sep):
                written.append(os.path.relpath(path, workdir))

    def watch(event, args):
        if event == "open" and ((args[2] or 0) & WRITING or any(c in (args[1] or "") for c in "wax+")):
            inside(args[0])
        elif event == "os.rename":
            inside(args[1])
        elif event in ("os.remove", "os.rmdir") or event == "os.mkdir" and not os.path.isdir(args[0]):
            inside(args[0])

    def save(record):
        with open(record, "w") as f:
            f.write(json.dumps(sorted(set(written))))
    """
)
# argv: WORKDIR RECORD SCRIPT ARGS...: run SCRIPT with ARGS; at exit, write to RECORD what HOOK recorded.
DRIVER = textwrap.dedent(
    """
    workdir, record, script = (os.path.abspath(arg) for arg in sys.argv[1:4])
    sys.addaudithook(watch)
    atexit.register(save, record)
    sys.argv = [script, *sys.argv[4:]]
    runpy.run_path(script, run_name="__main__")
    """
)
# argv: WORKDIR ROWS: run each list of eval.py arguments of the JSON file ROWS in this process, one after the other
# (tests/cli_rows.py); write to ROWS.<i>.json what HOOK recorded during row i and to ROWS.<i>.out its
# {"returncode", "stdout", "stderr"}.
ROWS_DRIVER = textwrap.dedent(
    f"""
    workdir, rows = os.path.abspath(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, {str(ROOT / "tests")!r})
    import cli_rows
    sys.addaudithook(watch)
    loaded = {{}}
    for index, args in enumerate(json.loads(open(rows).read())):
        written.clear()
        result = cli_rows.run_row("eval.py", args, loaded)
        save(f"{{rows}}.{{index}}.json")
        with open(f"{{rows}}.{{index}}.out", "w") as f:
            f.write(json.dumps(result))
    """
)


def start_eval(workdir: pathlib.Path, record: pathlib.Path, *args: str, devices: int) -> subprocess.Popen:
    """Start eval.py on `devices` CPU devices under DRIVER (its writes inside `workdir` go to `record`)."""
    return subprocess.Popen([sys.executable, "-c", HOOK + DRIVER, str(workdir), str(record), str(ROOT / "eval.py"),
                             f"--workdir={workdir}", *args], cwd=ROOT, env=script_env(devices),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def printed(stdout: str) -> list[str]:
    """The lines eval.py printed: all of standard output (the runtime's native messages go to standard error)."""
    assert "Gloo" not in stdout, stdout
    return stdout.splitlines()


def writes(record: pathlib.Path) -> list[str]:
    """The paths a HOOK record lists, a temporary file (`<path>.tmp.<unique>`, renamed over `path`) as `path`."""
    return sorted({path.split(".tmp.")[0] for path in json.loads(record.read_text())})


def eval_alone(workdir: pathlib.Path, records: pathlib.Path,
               *commands: tuple[str, ...]) -> list[tuple[list[str], list[str]]]:
    """eval.py with each of `commands`' arguments as one process with 4 CPU devices, the commands one after the
    other in one process (ROWS_DRIVER): per command, (printed lines, paths written inside the workdir)."""
    rows = records / "alone.rows.json"
    rows.write_text(json.dumps([[f"--workdir={workdir}", *args, "--cpu_devices=4"] for args in commands]))
    done = subprocess.run([sys.executable, "-c", HOOK + ROWS_DRIVER, str(workdir), str(rows)], cwd=ROOT,
                          env=script_env(4), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = []
    for index in range(len(commands)):
        result = json.loads(pathlib.Path(f"{rows}.{index}.out").read_text())
        assert result["returncode"] == 0, result["stderr"][-3000:]
        results.append((printed(result["stdout"]), writes(pathlib.Path(f"{rows}.{index}.json"))))
    return results


def eval_on_two_processes(workdir: pathlib.Path, records: pathlib.Path,
                          *args: str) -> list[tuple[list[str], list[str]]]:
    """eval.py as 2 processes x 2 CPU devices (--multihost): per process, (printed lines, paths written)."""
    cluster = ("--multihost", f"--coordinator_address=localhost:{free_port()}", "--num_processes=2")
    processes = [start_eval(workdir, records / f"process_{index}.json", *args, *cluster, f"--process_id={index}",
                            devices=2) for index in range(2)]
    outputs = finish_all(processes, timeout=300)
    return [(printed(stdout), writes(records / f"process_{index}.json"))
            for index, (stdout, _) in enumerate(outputs)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
    """The tiny run trained to step 200 on one device; checkpoints at steps 100 and 200."""
    directory = tmp_path_factory.mktemp("eval_multihost")
    workdir = directory / "run"
    # Compiled with XLA:CPU's own fused-loop emitters, at the suite's optimisation level 0 (runs.DEFAULT_EMITTER_FLAGS,
    # not what a user's run compiles): this model's sentences rest on the trajectory of its 200 updates, which the
    # suite's older emitters change in the last bits (to a model of empty lines).
    result = run_script("train.py", f"--config={write_config(directory)}", f"--workdir={workdir}", *TRAINING,
                        env=script_env(1, XLA_FLAGS=cpu_xla_flags(1, DEFAULT_EMITTER_FLAGS)))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def alone(trained, tmp_path_factory) -> dict:
    """The one-process references (ROWS_DRIVER): per command ("score", "translate", "average"), (printed lines,
    paths written); "expected": the .hyp and .json of the score's files, which are then removed for the two
    processes to write anew; "lines": the file translated."""
    records = tmp_path_factory.mktemp("eval_multihost_alone")
    lines = records / "lines.txt"
    lines.write_text("\n".join(SENTENCES) + "\n")
    commands = {"score": EVALUATION, "translate": (*EVALUATION, f"--translate={lines}"),
                "average": (*EVALUATION, f"--write_averaged={trained / 'alone'}")}
    results = dict(zip(commands, eval_alone(trained, records, *commands.values()), strict=True))
    written = trained / "eval" / "test.average_2_to_200"
    results["expected"] = {suffix: pathlib.Path(f"{written}{suffix}").read_text() for suffix in (".hyp", ".json")}
    shutil.rmtree(trained / "eval")
    return {**results, "lines": lines}


def test_two_processes_score_the_split_like_one_and_only_process_0_writes_and_prints(trained, alone, tmp_path):
    written = trained / "eval" / "test.average_2_to_200"
    (alone_lines, alone_writes), expected = alone["score"], alone["expected"]

    (first, first_writes), (second, second_writes) = eval_on_two_processes(trained, tmp_path, *EVALUATION)
    assert {suffix: pathlib.Path(f"{written}{suffix}").read_text() for suffix in (".hyp", ".json")} == expected
    assert first == alone_lines and alone_lines[0] == "test (16 sentences, checkpoint average:2 = steps [100, 200])"
    assert second == []
    assert first_writes == alone_writes and {"eval/test.average_2_to_200.hyp",
                                             "eval/test.average_2_to_200.json"} <= set(first_writes)
    assert second_writes == []
    # The outputs are real sentences of many lengths, so the comparison above can catch misplaced rows.
    hypotheses = expected[".hyp"].splitlines()
    assert len(hypotheses) == 16 and all(hypotheses) and len({len(line) for line in hypotheses}) > 8
    assert json.loads(expected[".json"])["steps"] == [100, 200]


def test_two_processes_translate_a_file_and_only_process_0_prints(trained, alone, tmp_path):
    alone_lines, alone_writes = alone["translate"]
    (first, first_writes), (second, second_writes) = eval_on_two_processes(
        trained, tmp_path, *EVALUATION, f"--translate={alone['lines']}")
    assert first == alone_lines and len(alone_lines) == 10 and alone_lines[5] == "" and all(alone_lines[:5])
    assert second == [] and first_writes == second_writes == alone_writes == []


def test_two_processes_write_the_averaged_parameters_once(trained, alone, tmp_path):
    alone_lines, alone_writes = alone["average"]
    (first, first_writes), (second, second_writes) = eval_on_two_processes(
        trained, tmp_path, *EVALUATION, f"--write_averaged={trained / 'two'}")
    assert first == [line.replace("alone", "two") for line in alone_lines] and second == []
    assert first_writes == [path.replace("alone", "two") for path in alone_writes] and second_writes == []
    # The same layout (array data under ocdbt.process_0/ only: Orbax writes it from process 0) and values.
    assert sorted(path.name for path in (trained / "two").iterdir()) == sorted(
        path.name for path in (trained / "alone").iterdir())
    assert (trained / "two" / "ocdbt.process_0").is_dir() and not list((trained / "two").rglob("*process_1*"))
    for a, b in zip(*(jax.tree.leaves(ocp.StandardCheckpointer().restore(str(trained / name)))
                      for name in ("alone", "two")), strict=True):
        np.testing.assert_array_equal(a, b)
