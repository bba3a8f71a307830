"""base/tensorboard.py: the run's TensorBoard event files, written without loading PyTorch."""

import glob
import subprocess
import sys

import pytest

from transformer_jax.base import workdir as layout


def test_tensorboard_events_are_written_without_loading_torch_which_stays_importable(tmp_path):
    """tensorboardX imports torch where it is installed (the `hf` extra: 1-2 s of every run's start); the run's
    writers load tensorboardX with torch hidden, write readable events, and leave torch importable."""
    pytest.importorskip("torch")  # the test extra installs it; without torch there is nothing to hide
    code = (
        "import sys\n"
        "from transformer_jax.base.tensorboard import ScalarEvents, tensorboard_writer\n"
        f"events = ScalarEvents({str(tmp_path)!r}, purge_step=0)\n"
        "events.add({'train/loss': 2.5}, step=1)\n"
        "events.close()\n"
        f"tensorboard_writer({str(tmp_path)!r}).close()\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"
        "print(torch.tensor([3]).item())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "3"]
    from tensorboardX.proto.event_pb2 import Event

    files = glob.glob(str(tmp_path / layout.TENSORBOARD / "events*"))
    assert len(files) == 2
    scalars = []
    for path in files:  # TFRecords: a length (8 bytes), its CRC (4), the Event, its CRC (4)
        data, offset = open(path, "rb").read(), 0
        while offset < len(data):
            length = int.from_bytes(data[offset:offset + 8], "little")
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 16 + length
            scalars += [(event.step, value.tag, value.simple_value) for value in event.summary.value]
    assert scalars == [(1, "train/loss", 2.5)]
