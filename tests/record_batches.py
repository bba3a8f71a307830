"""Run train.py unchanged, recording what this process reads and logs (for tests/test_multiprocess.py).

    RECORD_TO=DIR python tests/record_batches.py [train.py flags]

When train.py exits, writes DIR/process_<index>.npz (the `inputs` array of every training batch this
process read, in order) and DIR/process_<index>.json ({"metric_records": how many metrics lines
this process wrote, "pairs_in_rows": the pairs its batches' rows hold, "records_read": the pairs its
training corpus read from disk}). The recording only observes: every call goes through to the real
code. With TERMINATE_PROCESS=i and TERMINATE_AFTER_BATCH=n, process i sends itself SIGTERM once it
has read n batches (as a preempted host would get it, mid-run).
"""

import atexit
import json
import os
import pathlib
import runpy
import signal
import sys

# The checkout's package, not whichever copy is installed (a worktree, or an editable install of another).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from transformer_jax.data.batching import BatchIterator  # noqa: E402
from transformer_jax.run.metrics_log import MetricsLog  # noqa: E402

OUTPUT = pathlib.Path(os.environ["RECORD_TO"])
TRAIN_PY = pathlib.Path(__file__).resolve().parents[1] / "train.py"
batches: list[np.ndarray] = []
seen = {"process": None, "metric_records": 0, "pairs_in_rows": 0, "corpus": None}
read_batch, write_metrics = BatchIterator.__next__, MetricsLog.write


def recording_next(self: BatchIterator) -> dict[str, np.ndarray]:
    batch = read_batch(self)
    seen["process"] = jax.process_index()  # known once the run has joined the processes
    batches.append(batch["inputs"].copy())
    seen["corpus"] = self.corpus
    segments = batch.get("inputs_segmentation", (batch["inputs"] != 0).astype(int))
    seen["pairs_in_rows"] += int(segments.max(axis=1).sum())
    if (os.environ.get("TERMINATE_PROCESS") == str(seen["process"])
            and len(batches) == int(os.environ.get("TERMINATE_AFTER_BATCH", -1))):
        os.kill(os.getpid(), signal.SIGTERM)
    return batch


def counting_write(self: MetricsLog, *args, **kwargs) -> None:
    seen["metric_records"] += int(self.enabled)
    return write_metrics(self, *args, **kwargs)


def save() -> None:
    if seen["process"] is None:
        return
    OUTPUT.mkdir(parents=True, exist_ok=True)
    np.savez(OUTPUT / f"process_{seen['process']}.npz", *batches)
    records = getattr(seen["corpus"], "records_read", None)
    (OUTPUT / f"process_{seen['process']}.json").write_text(json.dumps(
        {"metric_records": seen["metric_records"], "pairs_in_rows": seen["pairs_in_rows"], "records_read": records}))


BatchIterator.__next__, MetricsLog.write = recording_next, counting_write
atexit.register(save)
sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
runpy.run_path(str(TRAIN_PY), run_name="__main__")
