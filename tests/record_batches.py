"""Run train.py unchanged, recording what this process reads and logs (for tests/test_multiprocess.py).

    RECORD_TO=DIR python tests/record_batches.py [train.py flags]

When train.py exits, writes DIR/process_<index>.npz (the `inputs` array of every training batch this
process read, in order) and DIR/process_<index>.json ({"metric_records": how many metrics lines
this process wrote}). The recording only observes: every call goes through to the real code.
"""

import atexit
import json
import os
import pathlib
import runpy
import sys

# The checkout's package, not whichever copy is installed (a worktree, or an editable install of another).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from transformer_jax.data.batching import BatchIterator  # noqa: E402
from transformer_jax.training.metrics_log import MetricsLog  # noqa: E402

OUTPUT = pathlib.Path(os.environ["RECORD_TO"])
TRAIN_PY = pathlib.Path(__file__).resolve().parents[1] / "train.py"
batches: list[np.ndarray] = []
seen = {"process": None, "metric_records": 0}
read_batch, write_metrics = BatchIterator.__next__, MetricsLog.write


def recording_next(self: BatchIterator) -> dict[str, np.ndarray]:
    batch = read_batch(self)
    seen["process"] = jax.process_index()  # known once the run has joined the processes
    batches.append(batch["inputs"].copy())
    return batch


def counting_write(self: MetricsLog, *args, **kwargs) -> None:
    seen["metric_records"] += int(self.enabled)
    return write_metrics(self, *args, **kwargs)


def save() -> None:
    if seen["process"] is None:
        return
    OUTPUT.mkdir(parents=True, exist_ok=True)
    np.savez(OUTPUT / f"process_{seen['process']}.npz", *batches)
    (OUTPUT / f"process_{seen['process']}.json").write_text(json.dumps({"metric_records": seen["metric_records"]}))


BatchIterator.__next__, MetricsLog.write = recording_next, counting_write
atexit.register(save)
sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
runpy.run_path(str(TRAIN_PY), run_name="__main__")
