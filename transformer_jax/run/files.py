"""Writing files so that an interrupted write never leaves a half-written or corrupted file."""

from __future__ import annotations

import os


def write_atomically(path: str, content: str | bytes) -> None:
    """Write `content` to a temporary file next to `path`, then rename it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp.{os.getpid()}"
    mode = "wb" if isinstance(content, bytes) else "w"
    try:
        with open(temporary, mode) as f:
            f.write(content)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
