"""Run train.py (or SCRIPT=eval.py) unchanged, sending it SIGTERM at a named point (tests/cli/test_signal_points.py).

    SIGNAL_AT=POINT [SCRIPT=eval.py] python tests/signal_at.py [the script's flags]

POINT is one of: "preparation" (the corpus is being written), "compiling" (the train step is compiled),
"evaluation" (the dev loss of a periodic evaluation, inside the training loop), "final translation" (the
test split is translated after training), "update" (the second update), "update twice" (two signals there),
"update and save" (the second update, then SIGNAL_AGAIN, SIGTERM or SIGINT, as the stop's checkpoint is being
saved), "compile NAME" (from another thread while XLA compiles the program jit_NAME: the stop abandons the compile),
"exit" (as the process exits after its work: during its atexit handlers), "writing scores" (eval.py: as
the scores' files are written). STOP_SIGNAL=SIGINT sends Ctrl-C's signal instead (the compile and exit points). The signal is real and arrives in the main thread exactly as a preempted VM's would; the function then
runs on as it would have.
"""

import atexit
import os
import pathlib
import runpy
import signal
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import transformer_jax.data.pipeline as pipeline  # noqa: E402
import transformer_jax.evaluation as evaluation  # noqa: E402
import transformer_jax.run.loop as loop  # noqa: E402
from transformer_jax.checkpoints.manager import Checkpointer  # noqa: E402
from transformer_jax.run import Trainer  # noqa: E402
from jax._src import compiler  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / os.environ.get("SCRIPT", "train.py")
POINTS = {"preparation": (pipeline, "write_prepared"), "compiling": (Trainer, "compile_steps"),
          "evaluation": (loop, "evaluate_loss"),
          "final translation": (evaluation, "evaluate_split"), "writing scores": (evaluation, "write_evaluation")}
STOP = getattr(signal, os.environ.get("STOP_SIGNAL", "SIGTERM"))


def signalled(function):
    def wrapper(*args, **kwargs):
        if not kwargs.get("limit"):  # the final test translation (dev BLEU passes a sentence limit)
            os.kill(os.getpid(), signal.SIGTERM)
        return function(*args, **kwargs)
    return wrapper


def at_update(function, signals):
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGTERM)
        return function(*args, **kwargs)
    return wrapper


def during_compile(function, name):
    """The compile of jit_`name` gets SIGTERM 0.3 s in, from another thread: the main thread waits on XLA. A
    compile done sooner is run again until the signal is sent, so that it lands in one (the suite's compiles of a
    tiny model can take less than 0.3 s; the process would otherwise finish its work first)."""
    def wrapper(backend, module, *args, **kwargs):
        if str(module.operation.attributes["sym_name"]).strip('"') != f"jit_{name}":
            return function(backend, module, *args, **kwargs)
        sent = threading.Event()
        threading.Timer(0.3, lambda: (sent.set(), os.kill(os.getpid(), STOP))).start()
        result = function(backend, module, *args, **kwargs)
        while not sent.is_set():
            result = function(backend, module, *args, **kwargs)
        return result
    return wrapper


def at_exit():
    os.kill(os.getpid(), STOP)
    time.sleep(0.2)  # a handler, if any, runs meanwhile


def again_while_saving(function):
    def wrapper(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, os.environ.get("SIGNAL_AGAIN", "SIGTERM")))
        return function(*args, **kwargs)
    return wrapper


point = os.environ["SIGNAL_AT"]
if point.startswith("compile "):
    compiler.backend_compile_and_load = during_compile(compiler.backend_compile_and_load, point.split()[1])
elif point == "exit":
    atexit.register(at_exit)
elif point.startswith("update"):
    Trainer.update = at_update(Trainer.update, 2 if point == "update twice" else 1)
    if point == "update and save":
        Checkpointer.save = again_while_saving(Checkpointer.save)
else:
    owner, name = POINTS[point]
    setattr(owner, name, signalled(getattr(owner, name)))
sys.argv = [str(SCRIPT), *sys.argv[1:]]
runpy.run_path(str(SCRIPT), run_name="__main__")
