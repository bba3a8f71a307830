"""Writing files so that an interrupted write never leaves a half-written or corrupted file."""

from __future__ import annotations

import os
import re
import socket
import uuid

import jax


def process_tag() -> str:
    """`<hostname>.<pid>[.p<JAX process index>]`: names no other process on any host sharing a disk uses.

    Hosts sharing a workdir (NFS, a mounted bucket) can run processes with equal pids (containers
    start at pid 1), so the pid alone does not tell them apart; the hostname does, and the JAX
    process index is added once jax.distributed has joined the run (asking earlier would start
    JAX's backends before `jax.distributed.initialize`).
    """
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"
    tag = f"{host}.{os.getpid()}"
    if jax.distributed.is_initialized():
        tag += f".p{jax.process_index()}"
    return tag


def unique_name(prefix: str) -> str:
    """`prefix` + this process's tag + a random suffix: a temporary name no other writer picks."""
    return f"{prefix}.{process_tag()}.{uuid.uuid4().hex[:8]}"


def write_atomically(path: str, content: str | bytes) -> None:
    """Write `content` to a temporary file next to `path`, then rename it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = unique_name(f"{path}.tmp")
    mode = "wb" if isinstance(content, bytes) else "w"
    try:
        with open(temporary, mode) as f:
            f.write(content)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
