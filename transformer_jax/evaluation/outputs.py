"""Where eval.py and train.py write their outputs: checked before any work, and written whole or not at all.

`file_in_the_way` finds the regular file that stops a folder from being made (the run's own folders are
checked by `base.workdir.check_layout`); `check_outside_checkpoints` and `check_new_output` turn the mistakes of an output's place into one line
each, before any work; `write_together` writes a set of files (a translation and its scores) so that a
failure (a full disk, a read-only file system) leaves neither a part of the set nor a temporary behind,
and names the file it failed on; `place_fault` names in one line the fault of a place that a write or read
met on the way (a directory where a file goes, a file where a folder goes, no permission, an immutable folder), and
`faults_named` does so for the files a command names; `check_writable` finds such a fault before any work, and
`check_output_dir` a folder that cannot be made. `resolved` and `file_identity` tell when two names are one place.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterable, Iterator, Mapping

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import (absolute, exists, is_dir, is_local, make_dirs, storage_error, storage_remedy,
                                        unique_name, write_atomically)
from transformer_jax.errors import CheckpointError, ConfigError, StorageError, UserError


def file_in_the_way(folder: str) -> str | None:
    """The path at or above `folder` that exists and is not a directory (so `folder` cannot be made), else None."""
    if not is_local(folder):
        return None  # an object store has no files in the way: a prefix is a folder
    current = os.path.abspath(folder)
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return None if os.path.isdir(current) else current


def check_output_dir(folder: str, what: str) -> None:
    """ConfigError unless `folder` (named `what`, e.g. "--output_dir") is a directory or can be made one: a file there,
    a file where one of its folders goes, or a link to nowhere there, each named."""
    if is_local(folder) and os.path.islink(folder) and not os.path.exists(folder):
        raise ConfigError(f"{what} {folder} is a symbolic link to {os.readlink(folder)}, which does not exist; fix the "
                          "link, or pass another directory")
    blocking = file_in_the_way(folder) if is_local(folder) else (folder if exists(folder) and not is_dir(folder)
                                                                  else None)
    if blocking is not None and resolved(blocking) == resolved(folder):
        raise ConfigError(f"{what} {folder} is a file; pass a directory (it is created if missing)")
    if blocking is not None:
        raise ConfigError(f"{what} {folder} cannot be made: {blocking} is a file, where a folder goes; move it away or "
                          f"choose another {what}")


def resolved(path: str) -> str:
    """Where `path` is, the links and '..' of its folders resolved (not a link at `path` itself); a URL as it is."""
    if not is_local(path):
        return path.rstrip("/")
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))


def file_identity(path: str) -> tuple[int, int] | str:
    """What tells an existing file from another however it is named (`./a`, a link to it): its device and inode; a
    URL's own text."""
    if not is_local(path):
        return path.rstrip("/")
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


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


def place_fault(error: OSError, then: str) -> StorageError | None:
    """One line for an OSError that the place of its file causes, naming the file and the fix, then `then` ("run the
    same command again"): a directory where a file goes, a file where a folder goes, no permission, an immutable
    file or folder, a read-only file system, a full disk. None for any other OSError (a bug keeps its traceback)."""
    path = os.fspath(error.filename) if error.filename is not None else None
    if path is None:
        return None
    if not is_local(path):
        folder = os.path.dirname(path)
    else:  # the folder that refused: the path itself when it is one (a write probe's), else the one it goes in
        folder = os.path.abspath(path) if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if error.errno == errno.EISDIR:
        return StorageError(f"{path} is a directory, where a file is written; move it away and {then}")
    blocking = file_in_the_way(path if error.errno == errno.EEXIST else folder) if is_local(path) else None
    if error.errno in (errno.ENOTDIR, errno.EEXIST) and blocking is not None:
        return StorageError(f"cannot write {path}: {blocking} is a file, where a folder goes; move it away and {then}")
    if error.errno == errno.EACCES:
        return StorageError(f"{path}: permission denied; give this user access to it and to {folder} (chmod, chown) "
                            f"and {then}")
    if error.errno == errno.EPERM:
        return StorageError(f"{path}: operation not permitted (an immutable file or folder: `lsattr -d {folder}` "
                            f"shows an i, `chattr -i` clears it; or a mount that forbids writing); make {folder} "
                            f"writable and {then}")
    if error.errno == errno.EROFS:
        return StorageError(f"{path}: read-only file system; make {folder} writable (remount it read-write) and "
                            f"{then}")
    return storage_error(error, f"writing {path}", f"{storage_remedy(error)} and {then}")


@contextlib.contextmanager
def faults_named(paths: Iterable[str], then: str) -> Iterator[None]:
    """An OSError that the place of a file at or under one of `paths` causes (or of a folder above one), while the
    block runs: one StorageError line naming it, the fix and `then` (place_fault). Any other OSError is a bug and
    keeps its traceback."""
    roots = [absolute(path) for path in paths]
    try:
        yield
    except OSError as error:
        if isinstance(error, UserError) or error.filename is None:
            raise
        path = absolute(os.fspath(error.filename))
        if not any(path.startswith(root) or root.startswith(path.rstrip("/") + "/") for root in roots):
            raise
        named = place_fault(error, then)
        if named is None:
            raise
        raise named from None


def check_writable(folders: Iterable[str]) -> None:
    """Each local folder made if missing, and taking a file (made and removed); else the OSError, naming the folder
    (inside `faults_named`: one line). Object stores are not probed."""
    for folder in dict.fromkeys(os.path.abspath(folder) for folder in folders if is_local(folder)):
        make_dirs(folder)
        probe = unique_name(os.path.join(folder, ".write-probe"))
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as error:
            raise OSError(error.errno, error.strerror, folder) from error  # the folder, not the probe's name
