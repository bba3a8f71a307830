"""A run directory's lifecycle for the commands: checked writable before any work, owned while training writes it
(`training_workdir`), removed when a first start fails before its first checkpoint, and what a stop left in it."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Iterator

from transformer_jax.base import (
    exists,
    is_dir,
    is_local,
    list_names,
    make_dirs,
    owning,
    read_records,
    remove,
    storage_errno,
    storage_error,
    storage_remedy,
    unique_name,
    write_atomically,
)
from transformer_jax.base import workdir as layout
from transformer_jax.errors import ConfigError


def saved_steps(workdir: str, names: list[str] | None = None) -> list[int]:
    """The steps of the checkpoints written whole in `workdir` (`names`: its checkpoints folder's, if read)."""
    directory = layout.run_path(workdir, layout.CHECKPOINTS)
    if names is None:
        names = list_names(directory) if is_dir(directory) else []
    return sorted(int(name) for name in names if name.isdigit())


def training_kept(workdir: str) -> str:
    """What a stop before the end of training leaves, read from the workdir: the newest checkpoint, a checkpoint cut
    short, or the logged steps that no checkpoint keeps."""
    directory = layout.run_path(workdir, layout.CHECKPOINTS)
    names = list_names(directory) if is_dir(directory) else []
    steps = saved_steps(workdir, names)
    cut = sorted(int(name.split(".")[0]) for name in names if name.split(".")[0].isdigit() and not name.isdigit())
    cut_short = (f"; the checkpoint of step {cut[-1]} was cut short (the next start removes what it left)"
                 if cut and (not steps or cut[-1] > max(steps)) else "")
    if steps:
        return f"the newest checkpoint is step {max(steps)}{cut_short}"
    metrics = layout.run_path(workdir, layout.METRICS)
    try:
        logged = [r["step"] for r in read_records(metrics) if r.get("split") == "train"] if exists(metrics) else []
    except Exception:  # noqa: BLE001 - a damaged log: say what the checkpoints say
        logged = []
    if logged:
        return (f"no checkpoint was written{cut_short}; the {max(logged)} steps logged are lost and a rerun starts "
                "over")
    return "nothing; training had not started (its own Ctrl-C saves a checkpoint and stops)"


def missing_directories(path: str) -> list[str]:
    """The local directories of `path` that do not exist yet, deepest first (none on an object store)."""
    missing: list[str] = []
    if is_local(path):
        directory = os.path.abspath(path)
        while not os.path.exists(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
    return missing


@contextlib.contextmanager
def removed_on_failure(path: str, complete: str) -> Iterator[None]:
    """Remove the local directories a failing block created for `path`, with what they hold, unless `complete` (a
    file the block writes last in `path`) is there: a failed first attempt leaves nothing behind. A directory that
    existed is never removed; a stop (Ctrl-C, SIGTERM) keeps what was made."""
    created = missing_directories(path)
    try:
        yield
    except Exception:
        if created and not os.path.exists(os.path.join(path, complete)):
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost one
        raise


def ensure_writable_workdir(workdir: str) -> list[str]:
    """Create `workdir` if needed; fail clearly when it cannot be written.

    Returns the local directories this call created, deepest first (none on an object store).
    """
    if not workdir:
        raise ConfigError("--workdir is empty; pass the directory for the run's checkpoints and logs")
    if is_local(workdir) and os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"workdir {workdir} is a file, not a directory; choose another --workdir")
    if is_local(workdir) and os.path.islink(workdir) and not os.path.exists(workdir):
        raise ConfigError(f"workdir {workdir} is a symbolic link to {os.path.realpath(workdir)}, which does not exist; "
                          "create that directory or fix the link")
    created = missing_directories(workdir)
    # Unique per process and host: hosts sharing the workdir may run processes with equal pids.
    probe = unique_name(os.path.join(workdir, ".write_test"))
    try:
        make_dirs(workdir)
        if is_local(probe):
            with open(probe, "w") as f:
                f.write("ok")
        else:
            write_atomically(probe, "ok")  # one object upload: no temporary object to leave behind
    except OSError as error:
        remedy = (f"make {workdir} writable or choose another --workdir" if storage_errno(error) == errno.EROFS
                  else storage_remedy(error))
        named = storage_error(error, f"writing to the workdir {workdir}", f"{remedy} and run the same command again")
        raise named or ConfigError(
            f"workdir {workdir} is not writable ({error.strerror or error}); choose another --workdir"
        ) from None
    finally:
        if is_local(probe) and os.path.lexists(probe):
            os.remove(probe)
    if not is_local(probe):
        remove(probe)
    return created


@contextlib.contextmanager
def training_workdir(workdir: str) -> Iterator[None]:
    """Create `workdir` and own it (run.lock, see base/lock.py) while training writes it.

    A first start that fails before it wrote a checkpoint (a data check, a bad vocabulary size, a model that
    does not fit, updates that all went non-finite) removes the workdir it created with everything in it (a
    prepared corpus, the tokenizer, logs): a failed first attempt leaves nothing behind, and its rerun would
    start from nothing anyway. Ctrl-C and SIGTERM keep what was made (a rerun resumes it, the corpus
    included); an existing workdir is never removed.
    """
    created = ensure_writable_workdir(workdir)
    try:
        with owning(workdir):
            yield
    except Exception:
        if created and not saved_steps(workdir):
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost directory this start created
        raise
    except BaseException:
        for directory in created:  # deepest first; rmdir fails on a directory holding anything
            try:
                os.rmdir(directory)
            except OSError:
                break
        raise
