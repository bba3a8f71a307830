"""One job owns a run directory (`<workdir>/run.lock`; a bulk output: `<output>.lock`), taken at start, released at
exit, taken over when stale.

Two `train.py` jobs writing one workdir would interleave their metrics and race inside Orbax's
checkpoint directories. The job that creates `run.lock` owns the workdir; another one is refused
with one line naming the owner (host, pid, start time) and what to do. `eval.py` takes no lock: it
only reads, and a reading Checkpointer never removes or writes checkpoint files.

What is guaranteed where:

* Creating the lock is atomic and exclusive. Locally (and on NFS) the content is written to a
  temporary file first and `os.link`ed to `run.lock`, which fails when the name exists; where hard
  links are refused (gcsfuse, some network filesystems) `run.lock` is created with O_EXCL instead; on `gs://`
  the object is uploaded with the precondition `ifGenerationMatch=0` (gcsfs `mode="create"`), which
  Cloud Storage rejects when the object exists. So of two jobs starting together exactly one wins.
  (An existing lock is read before creating one, so a second job is refused even on a store that
  ignores the precondition, as the GCS emulator of the tests does; the race itself is then open.)
* A lock left by a job that died (SIGKILL, a crashed host) is taken over with no manual step. On the
  owner's host the owner is dead when its pid no longer runs, or now runs another process (its start
  time differs; a rebooted host has another boot id). From another host, which cannot see the
  owner's processes, the owner is dead when its heartbeat (rewritten every `HEARTBEAT_SECONDS`) is
  older than `STALE_SECONDS`; this compares the owner's clock with the reader's, so hosts sharing a
  workdir must keep their clocks within a minute or so of each other (NTP does).
* Taking over a stale lock moves it away (locally an atomic rename; on `gs://` a delete after
  re-reading it) and then creates a new one exclusively, so two jobs taking over the same stale
  lock cannot both succeed, except on `gs://` in the instant between that re-read and the delete.

With several processes (a multi-host job) process 0 takes the lock before any process has written
anything but its write probe, and every process learns the outcome, so all of them stop when it is refused.
A job killed in the instant between writing the lock's temporary file and linking it leaves that
`run.lock.new.*` file behind (harmless; delete it); a write the storage refuses (a full disk) leaves
none, and is one StorageError line. A directory (or anything but a file) at `run.lock` is refused
before anything is moved or written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Iterator

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import (
    exists,
    is_file,
    is_local,
    read_text,
    remove,
    storage_named,
    unique_name,
    write_atomically,
)
from transformer_jax.errors import CheckpointError, UserError

HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0


class WorkdirLockedError(CheckpointError):
    """Another job owns the run directory."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The start time of process `pid` in clock ticks since boot (Linux), "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, under another user
    return True


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who holds a lock: written into `run.lock` as JSON."""

    host: str
    pid: int
    started: float  # time.time() when the lock was taken
    heartbeat: float  # time.time() of the owner's last heartbeat
    token: str  # unique per taking, so an owner recognises its own lock
    boot_id: str = ""
    process_start: str = ""

    @classmethod
    def this_process(cls) -> Owner:
        now = time.time()
        return cls(socket.gethostname(), os.getpid(), now, now, uuid.uuid4().hex, _boot_id(),
                   _process_start(os.getpid()))

    def describe(self) -> str:
        if self.pid == -1:
            return "its content could not be read: cut short or written by something else"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {started}"

    def is_dead(self, now: float | None = None) -> bool:
        """Whether the owner no longer runs (see the module docstring for how each case is told)."""
        if self.host == socket.gethostname():
            if self.boot_id and self.boot_id != _boot_id():
                return True  # the host rebooted since
            if not _pid_runs(self.pid):
                return True
            start = _process_start(self.pid)
            if self.process_start and start:
                return start != self.process_start  # the pid now runs another process
            return self.pid == os.getpid()  # not this process: it has not taken the lock yet
        return (time.time() if now is None else now) - self.heartbeat > STALE_SECONDS


def read_owner(path: str) -> Owner | None:
    """The owner recorded in lock file `path`; None when there is none (or it is unreadable)."""
    try:
        return Owner(**json.loads(read_text(path)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        # A lock file cut short or written by something else: treated as left by a dead job.
        return Owner("?", -1, 0.0, 0.0, "", "")


def _create_exclusively(path: str, content: str) -> bool:
    """Create `path` holding `content` unless it exists; True when this call created it."""
    if is_local(path):
        temporary = unique_name(f"{path}.new")
        try:
            with open(temporary, "w") as f:
                f.write(content)
            try:
                os.link(temporary, path)  # atomic, fails if `path` exists (also on NFS, unlike O_EXCL on old clients)
                return True
            except FileExistsError:
                return False
            except OSError:  # no hard links here (gcsfuse, some network filesystems): an exclusive create
                return _create_with_o_excl(path, content)
        finally:  # also when the temporary could not be written (a full disk)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    import fsspec

    filesystem, _ = fsspec.core.url_to_fs(path)
    try:
        filesystem.pipe_file(path, content.encode(), mode="create")  # ifGenerationMatch=0
        return True
    except FileExistsError:
        return False


def _create_with_o_excl(path: str, content: str) -> bool:
    """Create `path` with O_CREAT | O_EXCL where hard links are refused; True when this call created it.

    Exclusive on local disks and on gcsfuse (which creates the object only if absent). Unlike the linked
    lock, its content is written after the name exists: a job starting in that instant would read it as
    cut short and take it over, so on such filesystems two jobs started within milliseconds of each
    other are not told apart.
    """
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(descriptor, "w") as f:
            f.write(content)
    except OSError:
        os.unlink(path)  # a lock without its content would be taken for one cut short
        raise
    return True


def _remove_if_still(path: str, stale: Owner) -> None:
    """Remove lock `path` if it still holds `stale`'s token (another job may have just taken it over)."""
    if is_local(path):
        moved = unique_name(f"{path}.stale")
        try:
            os.rename(path, moved)  # atomic: of two jobs taking over, one moves the stale lock
        except FileNotFoundError:
            return
        if read_owner(moved) != stale:  # a live lock taken over an instant ago: put it back
            try:
                os.link(moved, path)
            except FileExistsError:
                pass
            except OSError:  # no hard links here: the same content, created exclusively
                _create_with_o_excl(path, read_text(moved))
        os.unlink(moved)
        return
    if read_owner(path) == stale:
        with contextlib.suppress(FileNotFoundError):
            remove(path)


class Claim:
    """A job's claim on `subject` (a workdir, an output): the lock file `path`, taken by `acquire()` or refused with
    a WorkdirLockedError naming the owner; `job` names what holds such claims, `flag` the way to another subject."""

    def __init__(self, path: str, subject: str, job: str, flag: str) -> None:
        self.path, self.subject, self.job, self.flag = path, subject, job, flag
        self.owner: Owner | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self, heartbeat: bool = True) -> None:
        """Take the lock (taking over a stale one); start the heartbeat unless `heartbeat` is False (then the holder
        calls `beat()` every HEARTBEAT_SECONDS, as `holding` does for many claims with one thread).

        Raises WorkdirLockedError when another job holds it, CheckpointError when something other than a file
        stands at its place, StorageError when the storage refuses to write it (a full disk).
        """
        if exists(self.path) and not is_file(self.path):  # a lock cannot be read, taken over or moved aside there
            raise CheckpointError(
                f"{self.path} is not a file, but a job keeps its lock in a file of that name; move it away and run "
                "the same command again"
            )
        with storage_named(f"taking the lock {self.path}"):
            if is_local(self.path):
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._take()
        if heartbeat:
            self._start_heartbeat()

    def _take(self) -> None:
        for _ in range(3):  # a stale lock is moved away, then created anew; a race may need another try
            # Looking first refuses a second job even on a store that ignores the create precondition
            # (the GCS emulator of the tests); the exclusive create settles two jobs starting together.
            current = read_owner(self.path)
            if current is not None:
                if not current.is_dead():
                    raise WorkdirLockedError(
                        f"{self.subject} is in use by another {self.job} ({current.describe()}); "
                        f"wait for it to finish or stop it, or choose another {self.flag} (if that job is gone, "
                        f"delete {self.path})"
                    )
                logging.warning("taking over the lock of %s left by a job that is gone (%s)", self.subject,
                                current.describe())
                _remove_if_still(self.path, current)
            # Owned before the file exists: a stop (SIGTERM raises wherever the main thread is) right after the
            # create still finds the lock to release; release() removes the file only if it holds this token.
            self.owner = Owner.this_process()
            if _create_exclusively(self.path, json.dumps(dataclasses.asdict(self.owner))):
                return
            self.owner = None
        raise WorkdirLockedError(f"{self.subject}: another job took the lock at the same time; "
                                 f"choose another {self.flag} or stop the other job")

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if this job still holds it."""
        if self.owner is None:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        current = read_owner(self.path)
        if current is not None and current.token == self.owner.token:
            with contextlib.suppress(FileNotFoundError):
                remove(self.path)
        self.owner = None

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS) and self.beat():
            pass

    def beat(self) -> bool:
        """Renew the heartbeat once; False when the lock is no longer this job's (nothing more to renew)."""
        try:
            current = read_owner(self.path)
            if current is None or self.owner is None or current.token != self.owner.token:
                logging.error("the lock %s is no longer held by this job", self.path)
                return False
            self.owner = dataclasses.replace(self.owner, heartbeat=time.time())
            write_atomically(self.path, json.dumps(dataclasses.asdict(self.owner)))
        except OSError as error:  # a storage hiccup: try again at the next beat
            logging.warning("could not renew the lock %s: %s", self.path, error)
        return True


class RunLock(Claim):
    """The lock of one workdir (`<workdir>/run.lock`)."""

    def __init__(self, workdir: str) -> None:
        super().__init__(layout.run_path(workdir, layout.LOCK), f"workdir {workdir}", "training job", "--workdir")
        self.workdir = workdir


@contextlib.contextmanager
def holding(claims: list[Claim], refused: str) -> Iterator[None]:
    """Hold every claim for the duration: process 0 takes them (one heartbeat thread renews them all); every process
    learns the outcome. Raises on every process when a claim is refused (process 0 what `Claim.acquire` raised,
    the others `refused`), after releasing those taken."""
    import jax

    refusal: UserError | None = None
    stop = threading.Event()
    beating: threading.Thread | None = None
    try:  # from the moment a lock may exist: a stop anywhere after (JAX starting its backend) releases it
        if jax.process_index() == 0:
            try:
                for claim in claims:
                    claim.acquire(heartbeat=len(claims) == 1)
            except UserError as error:  # another job's lock, a directory at its place, a full disk
                refusal = error
        if jax.process_count() > 1:
            import numpy as np
            from jax.experimental import multihost_utils

            refused_anywhere = bool(multihost_utils.broadcast_one_to_all(np.array(refusal is not None)))
            if refused_anywhere and refusal is None:
                refusal = WorkdirLockedError(refused)
        if refusal is not None:
            raise refusal
        if len(claims) > 1 and jax.process_index() == 0:
            def beat_all() -> None:
                while not stop.wait(HEARTBEAT_SECONDS):
                    for claim in claims:
                        claim.beat()
            beating = threading.Thread(target=beat_all, name="claims-heartbeat", daemon=True)
            beating.start()
        yield
    finally:
        stop.set()
        if beating is not None:
            beating.join()
        for claim in claims:
            claim.release()


@contextlib.contextmanager
def owning(workdir: str) -> Iterator[None]:
    """Hold `workdir`'s lock for the duration (process 0 takes it; every process learns the outcome).

    Raises WorkdirLockedError on every process when another job owns the workdir (process 0 raises what
    `RunLock.acquire` raised, the others say that process 0 names it).
    """
    with holding([RunLock(workdir)], f"workdir {workdir} is in use by another training job, or its lock could not "
                                     "be taken (process 0 names it)"):
        yield
