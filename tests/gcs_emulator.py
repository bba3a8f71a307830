"""A local Google Cloud Storage emulator (gcp-storage-emulator) that gcsfs, tensorboardX and TensorStore reach.

Each client finds it through its own setting: STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage),
TENSORSTORE_GCS_HTTP_URL (TensorStore's gcs kvstore, used by Orbax for arrays) and
GOOGLE_AUTH_TOKEN_FOR_TESTING (so TensorStore asks for no real credentials).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
from typing import Iterator

BUCKET = "test-bucket"


def emulator_env(url: str) -> dict[str, str]:
    """The environment variables pointing every GCS client at the emulator at `url`."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator", "GOOGLE_CLOUD_PROJECT": "test-project"}


@contextlib.contextmanager
def running_emulator() -> Iterator[dict[str, str]]:
    """Start an in-memory emulator holding bucket BUCKET; yields the environment that reaches it."""
    from gcp_storage_emulator.server import create_server

    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    server = create_server("localhost", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    # tensorboardX closes its writers again at exit (atexit, last registered first), uploading their
    # event files once more: stopping the emulator after them keeps those uploads from hanging.
    atexit.register(server.stop)
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
