"""How a command ends (transformer_jax/cli/stops.py): a stop is one line and its status wherever it lands, even
in the middle of an XLA compile, and a signal as a finished command exits is named, not fatal.

The eval.py cases run the real script through tests/signal_at.py with JAX's compilation cache off, so that the
compile the signal interrupts really runs (a stop used to abandon it and crash Python's teardown, status 139).
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from runs import ROOT, run_script, script_env
from transformer_jax.cli import stops


def test_sigterm_outside_the_loop_stops_with_one_line_and_the_chosen_status(capsys):
    """SIGTERM wherever the command is (not only in the training loop) unwinds: one line, no traceback."""
    for terminated_exit, hint in ((0, True), (stops.TERMINATED_EXIT, False)):
        before = signal.getsignal(signal.SIGTERM)
        with pytest.raises(stops.Stopped) as stopped:
            with stops.interrupts_reported(lambda: "nothing was written", terminated_exit, resumable=hint):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler interrupts this
        assert stopped.value.code == terminated_exit
        assert signal.getsignal(signal.SIGTERM) is before  # the handler it replaced is back
        line = capsys.readouterr().err.strip()
        assert line.startswith("stopped by SIGTERM: nothing was written") and line.endswith("resumes the run") == hint


def test_signals_held_are_delivered_when_the_block_ends():
    arrived = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: arrived.append(number))
    other = threading.Thread(target=time.sleep, args=(1,))  # a thread started before: it could take the signal
    other.start()
    try:
        with stops.signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            assert arrived == []  # held back while the block runs
        time.sleep(0.1)
        assert arrived == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


ENDED = """
import atexit, os, signal, sys, threading, time
from transformer_jax.cli.stops import end_process
written = []
def writer():
    time.sleep(0.3)
    written.append(1)
threading.Thread(target=writer).start()  # a non-daemon thread: joined before the exit
atexit.register(lambda: print("atexit ran, thread done:", written == [1], flush=True))
if {signalled}:
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.2)))
class Teardown:
    def __del__(self):
        print("interpreter teardown ran", flush=True)
keep = Teardown()
print("buffered", end="")
end_process({code})
"""


@pytest.mark.parametrize("code, signalled", [(0, False), (2, False), (0, True)])
def test_end_process_joins_threads_runs_atexit_and_skips_the_teardown(code, signalled):
    result = subprocess.run([sys.executable, "-c", ENDED.format(code=code, signalled=signalled)], cwd=ROOT,
                            env=script_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stderr
    assert result.stdout == "bufferedatexit ran, thread done: True\n"  # flushed; no teardown after it
    named = "SIGTERM arrived as the command was exiting; it had finished" in result.stderr
    assert named == signalled, result.stderr


@pytest.fixture()
def eval_signalled(trained_run):
    def run(point: str, *flags: str, signal_name: str = "") -> subprocess.CompletedProcess:
        env = script_env(SCRIPT="eval.py", SIGNAL_AT=point)
        if signal_name:
            env["STOP_SIGNAL"] = signal_name
        return run_script("tests/signal_at.py", f"--workdir={trained_run['workdir']}", "--compilation_cache=",
                          *flags, env=env, stdin="a small house\nthe dog\n")
    return run


@pytest.mark.parametrize("program, flags, finished", [
    ("translate_rows", (), "nothing was written"),
    ("translate_rows", ("--split=dev", "--mode=greedy"), "nothing was written"),
    ("translate_rows", ("--translate=-",), "0 translations printed above; nothing else was written"),
])
def test_sigterm_while_eval_compiles_is_one_line_and_status_143(eval_signalled, program, flags, finished):
    """The stop abandons XLA's compile of the search; the process ends at once after its line (no status 139)."""
    result = eval_signalled(f"compile {program}", *flags)
    assert result.returncode == 143, result.stderr[-3000:]
    assert "Fatal Python error" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == f"stopped by SIGTERM: {finished}"


def test_ctrl_c_while_eval_compiles_is_one_line_and_status_130(eval_signalled):
    result = eval_signalled("compile translate_rows", signal_name="SIGINT")
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Fatal Python error" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == "interrupted: nothing was written"


def test_sigterm_as_eval_exits_after_scoring_is_named_and_the_scores_are_kept(eval_signalled, trained_run):
    result = eval_signalled("exit", "--split=dev")
    assert result.returncode == 0, result.stderr[-3000:]  # it had finished: a scheduler must not rerun it
    assert result.stderr.strip().splitlines()[-1] == ("SIGTERM arrived as the command was exiting; it had "
                                                      "finished, and all it printed was written")
    written = result.stdout.strip().splitlines()[-1].split("hypotheses: ")[1]
    assert os.path.getsize(written) > 0 and os.path.exists(written.replace(".hyp", ".json"))


def test_sigterm_as_eval_writes_the_scores_waits_for_both_files_and_names_them(eval_signalled):
    result = eval_signalled("writing scores", "--split=dev")
    assert result.returncode == 143, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM: the scores printed above, written with the translations to "), last
    written = last.rsplit(" to ", 1)[1]
    assert "BLEU" in result.stdout and os.path.getsize(written) > 0
    assert os.path.exists(written.replace(".hyp", ".json"))


@pytest.mark.parametrize("signal_number, status, line", [(signal.SIGINT, 130, "interrupted: the work"),
                                                         (signal.SIGTERM, 143, "stopped by SIGTERM: the work")])
def test_a_stop_lost_in_a_callback_is_acted_on_when_the_work_ends(capsys, signal_number, status, line):
    """A stop raised where Python drops it (a callback it runs for itself, as JAX's during a compile) is not lost:
    the command stops with its line when its work returns, even before the signal is sent again."""
    with pytest.raises(stops.Stopped) as stopped:
        with stops.interrupts_reported(lambda: "the work"):
            try:  # what a callback that swallows the handler's exception does
                os.kill(os.getpid(), signal_number)
                time.sleep(0.05)
            except (KeyboardInterrupt, stops.Terminated):
                pass
    assert stopped.value.code == status
    assert capsys.readouterr().err.strip() == line
    assert not stops._unanswered  # nothing is sent again
