"""A local Google Cloud Storage emulator (gcp-storage-emulator) that gcsfs, tensorboardX and TensorStore reach.

Each client finds it through its own setting: STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage),
TENSORSTORE_GCS_HTTP_URL (TensorStore's gcs kvstore, used by Orbax for arrays) and
GOOGLE_AUTH_TOKEN_FOR_TESTING (so TensorStore asks for no real credentials).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from typing import Iterator

BUCKET = "test-bucket"


def emulator_env(url: str) -> dict[str, str]:
    """The environment variables pointing every GCS client at the emulator at `url`."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator", "GOOGLE_CLOUD_PROJECT": "test-project"}


# The emulator runs in a child process that serves until this process has gone. In-process, its thread
# would be stopped before tensorboardX's gs:// writers upload their event files one last time (their
# atexit hooks and finalizers run after every test), and each such upload would retry for two minutes.
SERVE = """
import os, sys, time
from gcp_storage_emulator.server import create_server
parent = int(sys.argv[2])
server = create_server("localhost", int(sys.argv[1]), in_memory=True, default_bucket=sys.argv[3])
server.start()
print("ready", flush=True)
while os.getppid() == parent:
    time.sleep(0.2)
server.stop()
"""


@contextlib.contextmanager
def running_emulator() -> Iterator[dict[str, str]]:
    """Start an in-memory emulator holding bucket BUCKET; yields the environment that reaches it."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", SERVE, str(port), str(os.getpid()), BUCKET],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError("the GCS emulator did not start (is gcp-storage-emulator installed?)")
    child.stdout.close()
    yield emulator_env(f"http://localhost:{port}")


@contextlib.contextmanager
def emulator_in_this_process(env: dict[str, str]) -> Iterator[None]:
    """Point this process's GCS clients at the emulator (gcsfs instances are cached: drop them around)."""
    import gcsfs

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    gcsfs.GCSFileSystem.clear_instance_cache()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gcsfs.GCSFileSystem.clear_instance_cache()
