"""Run train.py unchanged, sending it SIGTERM when it reaches a named point (for tests/cli/test_signal_points.py).

    SIGNAL_AT=POINT python tests/signal_at.py [train.py flags]

POINT is one of: "preparation" (the corpus is being written), "compiling" (the train step is compiled),
"evaluation" (the dev loss of a periodic evaluation, inside the training loop), "final translation" (the
test split is translated after training), "update" (the second update), "update twice" (two signals there),
"update and save" (the second update, then SIGNAL_AGAIN, SIGTERM or SIGINT, as the stop's checkpoint is being
saved). The signal is real and arrives in the main thread exactly as a preempted VM's would; the function then
runs on as it would have.
"""

import os
import pathlib
import runpy
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import transformer_jax.data.pipeline as pipeline  # noqa: E402
import transformer_jax.evaluation as evaluation  # noqa: E402
import transformer_jax.training.loop as loop  # noqa: E402
from transformer_jax.checkpoints.manager import Checkpointer  # noqa: E402
from transformer_jax.training.loop import Trainer  # noqa: E402

TRAIN_PY = pathlib.Path(__file__).resolve().parents[1] / "train.py"
POINTS = {"preparation": (pipeline, "write_prepared"), "compiling": (Trainer, "compile_steps"),
          "evaluation": (loop, "evaluate_loss"),
          "final translation": (evaluation, "evaluate_split")}


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


def again_while_saving(function):
    def wrapper(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, os.environ.get("SIGNAL_AGAIN", "SIGTERM")))
        return function(*args, **kwargs)
    return wrapper


point = os.environ["SIGNAL_AT"]
if point.startswith("update"):
    Trainer.update = at_update(Trainer.update, 2 if point == "update twice" else 1)
    if point == "update and save":
        Checkpointer.save = again_while_saving(Checkpointer.save)
else:
    owner, name = POINTS[point]
    setattr(owner, name, signalled(getattr(owner, name)))
sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
runpy.run_path(str(TRAIN_PY), run_name="__main__")
