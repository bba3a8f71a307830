"""SIGTERM at each point of a run outside the training loop stops it cleanly: one line, exit 143 (a scheduler
restarts a run that did not finish), the lock released, nothing half written, and the same command then
finishes the run.

The loop's own handling (a checkpoint at a step boundary) is tested in tests/run/test_loop.py and,
across processes, in tests/run/test_multiprocess.py.

Each stop is a train.py process of its own; one run takes six of them in turn on one workdir (ONE_RUN: the points
outside the loop, one stop before the first checkpoint, the periodic evaluation), the other stops before the first
checkpoint a new run each. The same command lines that then finish the stopped runs run in one process (runs.run_rows:
train.py's own flag parsing and main, each on its workdir), made once for the module by a fixture that records what
each stop left before the next process touches it.
"""

import json
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from runs import ROOT, run_rows, run_script, script_env, write_config
from transformer_jax.base import workdir as layout
from transformer_jax.base.log_records import read_metrics

# The loop's stop line: the step, the checkpoint, the seconds from the signal to it on disk, the step it arrived at.
STOP_LINE = re.compile(r"stopped by signal 15 at step (\d+): checkpoint (\d+) saved ([\d.]+) s after the signal, which "
                       r"arrived at step (\d+)(; .*)?; the same command resumes the run")


def stop_line(stdout: str) -> tuple[int, int, float, int, str]:
    """(step, checkpoint, seconds, step the signal arrived at, what else it says) of the loop's stop line."""
    found = STOP_LINE.search(stdout)
    assert found, stdout[-3000:]
    step, checkpoint, seconds, arrived, rest = found.groups()
    return int(step), int(checkpoint), float(seconds), int(arrived), rest or ""


def left_by_the_stop(workdir: pathlib.Path) -> dict:
    """What a stopped run left in its workdir (read before a rerun changes it): the lock, anything half written."""
    everything = list(workdir.rglob("*"))
    return {"lock": (workdir / layout.LOCK).exists(), "tmp": [path for path in everything if ".tmp" in path.name],
            "all": everything}


def assert_stopped_cleanly(result, left, finished):
    """`left`: left_by_the_stop of the run's workdir, read right after the stop."""
    assert result.returncode == 143, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"stopped by SIGTERM: {finished}") and last.endswith("resumes the run"), last
    assert not left["lock"]
    assert not left["tmp"], left["all"]


def rerun_each(config: str, workdirs: list[pathlib.Path], directory: pathlib.Path) -> list:
    """The same command (train.py --config --workdir) on each stopped workdir, all in one process (runs.run_rows)."""
    return run_rows("train.py", [[f"--config={config}", f"--workdir={workdir}"] for workdir in workdirs], directory)


def resumed_from(result, step: int) -> bool:
    """Whether the run of `result` resumed from the checkpoint of `step`."""
    return re.search(rf"^resumed from \S+/checkpoints/{step}$", result.stdout, re.M) is not None


OUTSIDE_THE_LOOP = [
    ("preparation", ("--multihost", "--num_processes=1", "--process_id=0"), "nothing; training had not started"),
    ("compiling", (), "nothing; training had not started"),
    ("final translation", (), "training finished at step 6"),
]
BEFORE_THE_FIRST_CHECKPOINT = [("update", None), ("update twice", "SIGTERM"), ("update and save", "SIGTERM"),
                               ("update and save", "SIGINT")]
# One run stopped at each of these in turn, on one workdir, each stop in a process of its own: what a stop promises
# holds at its place in the run (no checkpoint yet before the update, the update's checkpoint of step 2 before the
# periodic evaluation of step 3, that evaluation's checkpoint of step 3 while the second compile is stopped), and each
# process but the first is the same command resuming what the one before it left. The other cases of
# BEFORE_THE_FIRST_CHECKPOINT each stop a new run of their own.
ONE_RUN = ["preparation", "compiling", "update", "evaluation", "compiling again", "final translation"]


def signalled_run(config, workdir, point, *flags, again=None):
    return run_script("tests/signal_at.py", f"--config={config}", f"--workdir={workdir}", *flags,
                      env=script_env(SIGNAL_AT=point, SIGNAL_AGAIN=again or ""))


def stop_at(config: str, workdir: pathlib.Path, point: str, again: str | None = None) -> dict:
    """A run stopped at `point` (SIGNAL_AGAIN `again`) in a process of its own, and what it left, read at once."""
    from runs import free_port

    flags = {outside: flags for outside, flags, _ in OUTSIDE_THE_LOOP}.get(point, ())
    if flags:  # joined through jax.distributed, whose runtime must not take SIGTERM away from us
        flags += (f"--coordinator_address=localhost:{free_port()}",)
    result = signalled_run(config, workdir, point, *flags, again=again)
    timing = [json.loads(line) for line in (workdir / layout.TIMING).read_text().splitlines()] \
        if (workdir / layout.TIMING).exists() else []
    names = sorted(p.name for p in (workdir / layout.CHECKPOINTS).iterdir()) \
        if (workdir / layout.CHECKPOINTS).is_dir() else []
    return {"stopped": result, "left": left_by_the_stop(workdir), "timing": timing, "names": names,
            "manifest": (workdir / layout.CORPUS / "manifest.json").exists(),
            "dev records": [r for r in read_metrics(str(workdir)) if r["split"] == "dev"]
            if (workdir / layout.METRICS).exists() else []}


@pytest.fixture(scope="module")
def stops(tmp_path_factory):
    """{(point, again): what stop_at returned, with "next": the same command's next process on the workdir (the next
    stop of ONE_RUN, or the rerun) and "rerun": the same command finishing the workdir} for each stop of ONE_RUN
    (again None; "compiling again" its second compile) and each other case of BEFORE_THE_FIRST_CHECKPOINT. The stops
    each run in a process of their own, then the reruns all in one process (rerun_each)."""
    directory = tmp_path_factory.mktemp("stops")
    config = write_config(directory)
    made, workdirs = {}, [directory / "one_run"]
    for point in ONE_RUN:
        made[point, None] = stop_at(config, workdirs[0], point.removesuffix(" again"))
    for index, case in enumerate(BEFORE_THE_FIRST_CHECKPOINT[1:], start=1):
        workdirs.append(directory / f"run{index}")
        made[case] = stop_at(config, workdirs[-1], *case)
    reruns = rerun_each(config, workdirs, directory)
    for case, following in zip(ONE_RUN, [*ONE_RUN[1:], None]):
        made[case, None].update(next=made[following, None]["stopped"] if following else reruns[0], rerun=reruns[0])
    for case, rerun in zip(BEFORE_THE_FIRST_CHECKPOINT[1:], reruns[1:]):
        made[case].update(next=rerun, rerun=rerun)
    return {**made, "one run": workdirs[0]}


@pytest.mark.parametrize("point, flags, finished", OUTSIDE_THE_LOOP)
def test_sigterm_outside_the_loop_stops_cleanly_and_the_same_command_finishes(stops, point, flags, finished):
    made = stops[point, None]
    assert_stopped_cleanly(made["stopped"], made["left"], finished)
    if point == "preparation":
        assert not made["manifest"]  # an unfinished corpus is not taken
    rerun = made["rerun"]  # the same command, after the stops of ONE_RUN
    assert rerun.returncode == 0 and "test SacreBLEU" in rerun.stdout, rerun.stderr[-3000:]
    if point == "final translation":
        assert resumed_from(made["next"], 6)  # training was not redone


def test_sigterm_during_a_periodic_evaluation_abandons_it_and_the_restart_does_it(stops):
    """Inside the loop the signal is the loop's: the evaluation in progress is abandoned (not finished first), the
    checkpoint of that step is saved, and the run that resumes from it evaluates that step before going on."""
    made = stops["evaluation", None]
    stopped, left = made["stopped"], made["left"]
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    step, checkpoint, _, arrived, rest = stop_line(stopped.stdout)
    assert step == checkpoint == arrived == 3
    assert rest == "; its dev evaluation of step 3 was abandoned and is done when the run resumes"
    assert not made["dev records"]  # nothing of it was logged
    assert not left["lock"]
    assert max(int(name) for name in made["names"] if name.isdigit()) == 3
    # Stopped again while the resumed run compiles: the line says what is on disk, not "nothing".
    compiling = stops["compiling again", None]
    assert_stopped_cleanly(compiling["stopped"], compiling["left"], "the newest checkpoint is step 3")
    assert resumed_from(compiling["next"], 3)  # the same command, stopped once more (ONE_RUN), then finished
    rerun = made["rerun"]
    assert rerun.returncode == 0 and "test SacreBLEU" in rerun.stdout, rerun.stderr[-3000:]
    assert [r["step"] for r in read_metrics(str(stops["one run"])) if r["split"] == "dev"] == [3, 6]  # 3's first


@pytest.mark.parametrize("point, again", BEFORE_THE_FIRST_CHECKPOINT)
def test_a_stop_before_the_first_checkpoint_keeps_its_promise(stops, point, again):
    """One signal, or a second one (SIGTERM or Ctrl-C's SIGINT) while the stop's checkpoint is being written: the
    checkpoint is finished whole, the line says so, and the same command resumes from it."""
    made = stops[point, again]
    stopped, timing, names = made["stopped"], made["timing"], made["names"]
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    step, checkpoint, seconds, arrived, _ = stop_line(stopped.stdout)
    assert step == checkpoint == 2 and arrived == 1  # sent while update 2 was being dispatched
    (record,) = [t for t in timing if "stop_seconds" in t]
    assert record["step"] == 2 and record["signal_step"] == 1 and abs(record["stop_seconds"] - seconds) <= 0.05
    if again:
        number = getattr(signal, again).value
        assert f"signal {number} again: stopping after the checkpoint is written" in stopped.stdout, stopped.stdout
    assert [name for name in names if name.isdigit()] == ["2"] and not [n for n in names if "tmp" in n], names
    assert not made["left"]["lock"]
    assert resumed_from(made["next"], 2), made["next"].stdout[-3000:]  # the same command's next process
    rerun = made["rerun"]
    assert rerun.returncode == 0 and "test SacreBLEU" in rerun.stdout, rerun.stderr[-3000:]


def test_the_stop_line_reads_the_disk_and_the_log(tmp_path):
    """Outside the loop, the line says what a stop leaves: a checkpoint cut short, logged steps nothing keeps."""
    from transformer_jax.cli import training_kept

    workdir = tmp_path / "run"
    assert training_kept(str(workdir)).startswith("nothing; training had not started")
    (workdir / layout.CHECKPOINTS / "1050.orbax-checkpoint-tmp-12").mkdir(parents=True)
    (workdir / layout.METRICS).write_text("".join(f'{{"step": {s}, "split": "train", "loss": 1.0}}\n'
                                                  for s in (50, 1050)))
    assert training_kept(str(workdir)) == ("no checkpoint was written; the checkpoint of step 1050 was cut short (the "
                                           "next start removes what it left); the 1050 steps logged are lost and a "
                                           "rerun starts over")
    (workdir / layout.CHECKPOINTS / "1000").mkdir()
    assert training_kept(str(workdir)) == ("the newest checkpoint is step 1000; the checkpoint of step 1050 was cut "
                                           "short (the next start removes what it left)")


def test_sigterm_during_the_imports_stops_with_one_line_and_leaves_no_workdir(tmp_path):
    """The package's first line records a signal for the checkout's scripts; the command stops once its handler is in
    place."""
    from runs import start_script

    config, workdir = write_config(tmp_path), tmp_path / "run"
    process = start_script("train.py", f"--config={config}", f"--workdir={workdir}")
    time.sleep(0.5)  # past train.py's first lines, long before its imports finish
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM: nothing; training had not started")
    assert not workdir.exists()


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_sigterm_during_the_commands_imports_is_one_line_from_every_entry_point(tmp_path, entry):
    """The transformer-jax command records a signal from its package's first line, before JAX is imported."""
    command = ([str(pathlib.Path(sys.executable).parent / "transformer-jax")] if entry == "console script"
               else [sys.executable, "-m", "transformer_jax"])
    process = subprocess.Popen([*command, "score", f"--workdir={tmp_path / 'run'}"], cwd=tmp_path,
                               env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # past the interpreter's start, long before the command's imports finish
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "stopped by SIGTERM: nothing was written"


def test_a_library_importing_the_package_keeps_its_signal_handlers():
    """Only the command records early signals: a program that imports transformer_jax dies of SIGTERM as before."""
    from transformer_jax.early_signals import is_command

    assert is_command(["/venv/bin/transformer-jax", "score"], [])
    assert is_command(["-m"], ["python3", "-m", "transformer_jax", "score"])
    assert is_command([str(ROOT / "train.py")], []) and is_command([str(ROOT / "eval.py")], [])
    assert not is_command(["/elsewhere/train.py"], ["python3", "/elsewhere/train.py"])  # another program's train.py
    assert not is_command(["-m"], ["python3", "-m", "my_project.main"])
    program = "import os, signal, time, transformer_jax; os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)"
    result = subprocess.run([sys.executable, "-c", program], env=script_env(), capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGTERM


SWALLOWED = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (a background job ignores it)
from transformer_jax.cli.stops import interrupts_reported

class Dropped:
    def __del__(self):  # Python prints an exception raised here and goes on ("Exception ignored in")
        os.kill(os.getpid(), signal.{name})
        time.sleep(0.1)  # the handler runs, and raises, inside this frame

with interrupts_reported(lambda: "step {{}} of 10".format(done), terminated_exit=0):
    done = 0
    Dropped()
    for done in range(1, 11):
        time.sleep(1)
print("not stopped", done)
"""


@pytest.mark.parametrize("name, status, line", [("SIGTERM", 0, "stopped by SIGTERM: step"),
                                                ("SIGINT", 130, "interrupted: step")])
def test_a_stop_raised_where_python_drops_it_is_sent_again(name, status, line):
    """A signal's exception raised inside a __del__ (or one of JAX's gc callbacks) is lost; it comes again, and
    the lost one prints nothing ("Exception ignored in ... KeyboardInterrupt" before the stop's line)."""
    result = subprocess.run([sys.executable, "-c", SWALLOWED.format(name=name)], cwd=ROOT, env=script_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == status and "not stopped" not in result.stdout, result.stderr[-3000:]
    [last] = result.stderr.strip().splitlines()  # the stop's line alone
    assert last.startswith(line) and int(last.split("step ")[1].split()[0]) <= 3, last  # the second raise was not lost


def test_a_sigint_the_command_was_started_ignoring_stays_ignored():
    """A shell's background job (`cmd &`) starts with SIGINT ignored, so a Ctrl-C meant for the shell spares it."""
    script = ("import os, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "from transformer_jax.cli.stops import interrupts_reported\n"
              "with interrupts_reported(lambda: 'nothing'):\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(1.5)\nprint('still running')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=script_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "still running\n", result.stderr[-3000:]
