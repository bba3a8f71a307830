"""The workdir's file layer: local paths and object-store URLs (`gs://bucket/run`) alike.

Every read and write of a run's files goes through here (or through Orbax, which handles `gs://`
itself), so a workdir may live on Google Cloud Storage. Local paths keep the POSIX behaviour they
always had (atomic rename, appends); object stores go through etils `epath` (gcsfs for `gs://`).
A write the machine's storage refuses (a full disk, a read-only file system) leaves nothing half
written; `storage_error` names such a fault in one line.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
import socket
import uuid
from typing import Iterator

import jax
from etils import epath

from transformer_jax.errors import ConfigError, StorageError


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


def is_local(path: str | os.PathLike) -> bool:
    """True for a path on this machine's file system, False for a URL such as `gs://bucket/run`."""
    return "://" not in os.fspath(path)


# The project's extra installing the client of an object store, by URL scheme (`pip install 'transformer-jax[gcs]'`).
STORE_EXTRAS = {"gs": "gcs", "gcs": "gcs"}


@functools.cache
def _missing_client(scheme: str) -> str | None:
    """The package fsspec needs for URLs of `scheme` when it cannot be imported, else None (also for a scheme fsspec
    does not know: its own error names that)."""
    from fsspec.registry import get_filesystem_class, known_implementations

    try:
        get_filesystem_class(scheme)
    except ImportError:
        return known_implementations[scheme]["class"].partition(".")[0]
    except ValueError:  # "Protocol not known"
        return None
    return None


def object_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an `epath.Path`; a URL (`gs://bucket/run`) whose object-store client is not installed is a
    ConfigError naming the path, the package and how to install it, not the ImportError of the first read."""
    path = os.fspath(path)
    if not is_local(path):
        scheme = path.partition("://")[0]
        package = _missing_client(scheme)
        if package is not None:
            install = (f"pip install 'transformer-jax[{STORE_EXTRAS[scheme]}]'" if scheme in STORE_EXTRAS
                       else f"pip install {package}")
            raise ConfigError(f"{path} is a {scheme}:// path, which needs the {package} package, not installed; "
                              f"{install} (or use a local path)")
    return epath.Path(path)


def absolute(path: str) -> str:
    """`path` made absolute when local; a URL is already absolute and is returned as is."""
    return os.path.abspath(path) if is_local(path) else path


def exists(path: str) -> bool:
    """Whether a file or directory exists at `path`."""
    return object_path(path).exists()


def is_file(path: str) -> bool:
    """Whether `path` is a file."""
    return object_path(path).is_file()


def is_dir(path: str) -> bool:
    """Whether `path` is a directory (on an object store: a prefix some object lies under)."""
    return object_path(path).is_dir()


def list_names(directory: str) -> list[str]:
    """The names of the entries of `directory`."""
    return [child.name for child in object_path(directory).iterdir()]


def make_dirs(path: str) -> None:
    """Create directory `path` and its parents if missing (object stores need none: a no-op there)."""
    object_path(path).mkdir(parents=True, exist_ok=True)


def read_text(path: str) -> str:
    """The content of text file `path`."""
    return object_path(path).read_text()


def read_bytes(path: str) -> bytes:
    """The content of file `path`."""
    return object_path(path).read_bytes()


def remove(path: str) -> None:
    """Delete file `path`."""
    if is_local(path):
        os.remove(path)
    else:
        object_path(path).unlink()


def move(source: str, destination: str) -> None:
    """Move file or directory `source` to `destination` (on an object store: copy, then delete).

    Objects are copied one by one through epath, so that the client every other call here uses (and
    Orbax, through epath too) sees the move: object-store clients cache directory listings, and a move
    made through another client would leave this one listing `source` as present. epath's own rename
    is no help: it wants the destination's parent folder to exist, and an object store has folders
    only while objects lie under them. The bytes pass through this machine, which suits the rare,
    small moves made here (a damaged checkpoint set aside).
    """
    if is_local(source):
        shutil.move(source, destination)
        return
    root = object_path(source)
    if root.is_file():
        root.copy(destination)
        root.unlink()
        return
    _copy_tree(root, object_path(destination))
    root.rmtree()


def _copy_tree(source: epath.Path, destination: epath.Path) -> None:
    for child in source.iterdir():
        if child.is_dir():
            _copy_tree(child, destination / child.name)
        else:
            child.copy(destination / child.name)


def append_text(path: str, text: str) -> None:
    """Add `text` at the end of `path` (created if missing).

    Locally one `write()` in append mode, so a crash leaves at most a cut-short last line; a write that
    fails (a full disk) is taken back, so the file never ends in part of `text`. Objects cannot be
    appended to: the object is rewritten whole (each write replaces it atomically), which costs
    O(file size) per call and suits small logs such as metrics.jsonl.
    """
    if is_local(path):
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size, data = os.fstat(descriptor).st_size, text.encode()
            try:
                while data:
                    data = data[os.write(descriptor, data):]
            except OSError as error:
                with contextlib.suppress(OSError):
                    os.ftruncate(descriptor, size)  # frees what was written, so it works on a full disk too
                raise OSError(error.errno, error.strerror, path) from error  # a failed write() names no file
        finally:
            os.close(descriptor)
        return
    target = object_path(path)
    target.write_text((target.read_text() if target.exists() else "") + text)


def write_atomically(path: str, content: str | bytes) -> None:
    """Write `path` so that readers see the old content or the new one, never a part.

    Locally: a temporary file next to `path`, renamed over it; a failure removes the temporary and is an
    OSError naming `path`. An object store has no rename, but replaces each object atomically on upload:
    the content is written to `path` directly.
    """
    write_streamed(path, iter([content.encode("utf-8") if isinstance(content, str) else content]))


def write_streamed(path: str, chunks: Iterator[bytes]) -> None:
    """Write the `chunks` to `path` as `write_atomically` does (readers see the old file or the whole new one),
    without holding them in memory: a local temporary renamed over `path`, or one object upload."""
    if not is_local(path):
        with object_path(path).open("wb") as f:
            for chunk in chunks:
                f.write(chunk)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = unique_name(f"{path}.tmp")
    try:
        with open(temporary, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.errno is not None:
            raise OSError(error.errno, error.strerror, path) from error  # naming `path`, not the temporary
        raise


@contextlib.contextmanager
def directory_written_whole(directory: str) -> Iterator[str]:
    """Yield a new local folder beside `directory` to fill; on leaving it becomes `directory` (absent or an empty
    directory), whole or not at all: on any failure the folder is removed, and an OSError (a full disk) names
    `directory`, so a retry finds nothing to refuse."""
    directory = os.path.normpath(directory)
    staging = unique_name(os.path.join(os.path.dirname(os.path.abspath(directory)), f".{os.path.basename(directory)}.tmp"))
    try:
        os.makedirs(staging)
        yield staging
        os.replace(staging, directory)  # onto an absent or empty directory
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise OSError(error.errno, error.strerror, directory) from error
        raise


# OSError numbers that are the machine's storage, not a bug: a full disk or quota, a file-size limit, a
# read-only file system.
STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                  errno.EFBIG: "file too large for the file system or its limit", errno.EROFS: "read-only file system",
                  errno.EACCES: "permission denied", errno.EPERM: "operation not permitted (an immutable file or "
                  "directory, or another user's)"}
# What the user does about each, before running the same command again.
STORAGE_REMEDIES = {errno.ENOSPC: "free space", errno.EDQUOT: "free space or raise the quota",
                    errno.EFBIG: "raise the file-size limit (ulimit -f)", errno.EROFS: "make the file system writable",
                    errno.EACCES: "make the folder writable for this user", errno.EPERM: "make the folder writable"}
# The faults whose remedy names the folder of the file refused, when the error names the file.
_FOLDER_REMEDIES = {errno.EROFS, errno.EACCES, errno.EPERM}
# How TensorStore (Orbax's array writer) reports the OSError under a failed write, in its message.
_TENSORSTORE_ERRNO = re.compile(r"os_error_code='?(\d+)")


def storage_errno(error: BaseException) -> int | None:
    """The number of the storage fault (STORAGE_ERRNOS) behind `error`, else None.

    Looks through the chain of causes: an OSError, or an error of Orbax's writers that carries the
    OSError only in its message (TensorStore: "... No space left on device [os_error_code='28']").
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error.errno
        found = _TENSORSTORE_ERRNO.search(str(error))
        if found and int(found.group(1)) in STORAGE_ERRNOS:
            return int(found.group(1))
        error = error.__cause__ or error.__context__
    return None


def storage_remedy(error: BaseException) -> str:
    """What to do about the storage fault behind `error` ("free space"; see STORAGE_REMEDIES); a read-only
    file system with the file named: "make <its folder> writable"."""
    code, filename = storage_errno(error), getattr(error, "filename", None)
    if code in _FOLDER_REMEDIES and filename:
        return f"make {os.path.dirname(os.path.abspath(filename))} writable"
    return STORAGE_REMEDIES.get(code, "free space")


def storage_error(error: BaseException, doing: str, after: str | None = None) -> StorageError | None:
    """A StorageError line for `error` when it is a fault of the machine's storage (see storage_errno), else None.

    `doing` says what was being written ("writing checkpoint 6"), `after` what is kept and how to go on
    (default: the fault's own remedy, storage_remedy, and the same command again).
    """
    code = storage_errno(error)
    if code is None:
        return None
    if after is None:
        after = f"{storage_remedy(error)} and run the same command again"
    filename = getattr(error, "filename", None)
    where = f" ({filename})" if filename else ""
    return StorageError(f"{doing}{where} failed: {STORAGE_ERRNOS[code]}; {after}")


@contextlib.contextmanager
def storage_named(doing: str, then: str = "run the same command again") -> Iterator[None]:
    """A storage fault (a full disk, a quota, a read-only file system) while `doing` becomes one StorageError
    line saying what to do (storage_remedy) and `then`; any other OSError is a bug and keeps its traceback."""
    try:
        yield
    except OSError as error:
        named = storage_error(error, doing, f"{storage_remedy(error)} and {then}")
        if named is None:
            raise
        raise named from None


class DirectoryWatch:
    """Tells whether directory `path` is still the one that was there when the watch began.

    Locally the directory is held open, so that its inode cannot pass to a directory made anew at its
    place (Orbax makes a checkpoint's parents): it vanished when it has no name left or `path` names
    another. On an object store, which has no such thing, it vanished when nothing lies under `path`.
    A directory absent when the watch begins never counts as vanished.
    """

    def __init__(self, path: str) -> None:
        self.path, self._descriptor, self._existed = path, None, False
        if is_local(path):
            with contextlib.suppress(OSError):
                self._descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        else:
            self._existed = exists(path)

    def vanished(self) -> bool:
        """Whether the directory was removed, moved away or replaced since the watch began."""
        if self._descriptor is None:
            return self._existed and not exists(self.path)
        held = os.fstat(self._descriptor)
        try:
            named = os.stat(self.path)
        except OSError:
            return True
        return held.st_nlink == 0 or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino)

    def close(self) -> None:
        """Let the directory go."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
