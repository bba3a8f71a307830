"""Run train.py unchanged, appending this process's update count to a file after every update.

    STEPS_TO=DIR python tests/run/train_counting_steps.py [train.py flags]

Writes one line per update to DIR/process_<index>.txt (the number of updates this process has made
since it started, counted from the step it resumed at), so a test can see how far each process of a
multi-process run has got while no log line is written. Every call goes through to the real code.
"""

import os
import pathlib
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's package, as train.py itself gets (its folder comes first)

import jax  # noqa: E402

from transformer_jax.run import Trainer  # noqa: E402

OUTPUT = pathlib.Path(os.environ["STEPS_TO"])
TRAIN_PY = ROOT / "train.py"
real_update = Trainer.update


def counting_update(self: Trainer):
    metrics = real_update(self)
    self.updates_made = getattr(self, "updates_made", 0) + 1
    with open(OUTPUT / f"process_{jax.process_index()}.txt", "a") as f:
        f.write(f"{self.updates_made}\n")
    return metrics


OUTPUT.mkdir(parents=True, exist_ok=True)
Trainer.update = counting_update
sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
runpy.run_path(str(TRAIN_PY), run_name="__main__")
