"""Where eval.py and train.py write their outputs: checked before any work, and written whole or not at all.

`file_in_the_way` finds the regular file that stops a folder from being made (the run's own folders are
checked by `base.workdir.check_layout`); `check_outside_checkpoints` and `check_new_output` turn the mistakes of an output's place into one line
each, before any work; `write_together` writes a set of files (a translation and its scores) so that a
failure (a full disk, a read-only file system) leaves neither a part of the set nor a temporary behind,
and names the file it failed on.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import exists, is_local, unique_name, write_atomically
from transformer_jax.errors import CheckpointError


def file_in_the_way(folder: str) -> str | None:
    """The path at or above `folder` that exists and is not a directory (so `folder` cannot be made), else None."""
    if not is_local(folder):
        return None  # an object store has no files in the way: a prefix is a folder
    current = os.path.abspath(folder)
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return None if os.path.isdir(current) else current


def check_outside_checkpoints(workdir: str, path: str, what: str) -> None:
    """Fail with a CheckpointError when `path` (named `what` in the message, e.g. "--export directory") lies in
    the run's checkpoints folder, symlinks and '..' resolved: train.py would take it for a damaged checkpoint."""
    checkpoints = layout.run_path(workdir, layout.CHECKPOINTS)
    if is_local(path) and is_local(checkpoints):
        inside, folder = os.path.realpath(path), os.path.realpath(checkpoints)
    else:
        inside, folder = path.rstrip("/"), checkpoints.rstrip("/")
    if inside == folder or inside.startswith(folder.rstrip("/") + "/"):
        raise CheckpointError(f"{what} {path} is inside the run's checkpoints folder {checkpoints}, where train.py "
                              "would take it for a damaged checkpoint; choose a path outside it")


def check_new_output(workdir: str, path: str, what: str) -> None:
    """Fail with a CheckpointError unless `path` (named `what`) is new, outside the run's checkpoints folder,
    and can be made (no file stands where one of its folders goes)."""
    check_outside_checkpoints(workdir, path, what)
    if exists(path):
        raise CheckpointError(f"{path} already exists; choose another path or remove it")
    blocking = file_in_the_way(os.path.dirname(os.path.abspath(path))) if is_local(path) else None
    if blocking is not None:
        raise CheckpointError(f"cannot write {path} (Not a directory: {blocking} is a file); choose another path")


def write_together(contents: Mapping[str, str | bytes]) -> None:
    """Write each {path: content} so that a reader sees all the new files or none (when local).

    Every content goes to a temporary beside its path first; only when all are written are they renamed
    into place, and a failure removes the temporaries. An OSError names the path, not its temporary; a
    directory standing at a path is a CheckpointError, before anything is written. On an object store,
    each object is replaced whole on upload, one after another.
    """
    if not all(is_local(path) for path in contents):
        for path, content in contents.items():
            write_atomically(path, content)
        return
    for path in contents:
        if os.path.isdir(path):
            raise CheckpointError(f"{path} is a directory, where a file is written; move it away and run the "
                                  "same command again")
    temporaries: dict[str, str] = {}
    current = ""  # the path being written: a failed write() names no file
    try:
        for current, content in contents.items():
            os.makedirs(os.path.dirname(os.path.abspath(current)), exist_ok=True)
            temporaries[current] = unique_name(f"{current}.tmp")
            with open(temporaries[current], "wb" if isinstance(content, bytes) else "w") as file:
                file.write(content)
        for current, temporary in temporaries.items():
            os.replace(temporary, current)
    except OSError as error:
        _remove(temporaries.values())
        raise OSError(error.errno, error.strerror, current) from error
    except BaseException:
        _remove(temporaries.values())
        raise


def _remove(paths: Iterable[str]) -> None:
    for path in paths:
        if os.path.exists(path):
            os.unlink(path)
