"""How a command reports a mistake a user can make: one line on standard error and an exit status (the statuses
every command shares are here), never a traceback; standard output whose failing writes name the storage."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, TextIO

from transformer_jax.base import storage_error, storage_remedy
from transformer_jax.errors import DeviceError, UserError


# Exit status of a run stopped by a user error (bad flag, config value, data, checkpoint).
USER_ERROR_EXIT = 2
# Exit status of a run stopped because a program failed on the device (errors.DeviceError).
DEVICE_ERROR_EXIT = 3
# Exit status of a process of a multi-process run ended because another one died: PEER_LOST_EXIT (4), declared
# with the watch that ends it (base/peer_watch.py).
# Exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT = 130
# Exit status of a command whose standard output was closed by its reader (128 + SIGPIPE, as shells report it).
BROKEN_PIPE_EXIT = 141
# Exit status of a command stopped by SIGTERM, unless a rerun resumes it (train.py: 0).
TERMINATED_EXIT = 143


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError into one line on stderr and exit status 2 (3 for a DeviceError: a program failed on the
    device); any other exception is a bug and keeps its traceback.

    An OSError of the machine's storage (a full disk, a read-only file system) that reached this far
    unnamed is one line as well: it is no bug, and its traceback would hide the one thing to do.
    A closed standard output is refused before any work: what the command prints would be lost.
    """
    if sys.stdout is None:
        print("error: standard output is closed, so what this command prints (scores, translations) would be "
              "lost; run it with standard output open (redirect it to a file: > out.txt)", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    sys.stdout = NamedOutput(sys.stdout)
    try:
        yield
    except UserError as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(DEVICE_ERROR_EXIT if isinstance(error, DeviceError) else USER_ERROR_EXIT)
    except BrokenPipeError:  # the reader of standard output is gone (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes it
        sys.exit(BROKEN_PIPE_EXIT)
    except OSError as error:
        named = storage_error(error, "a write (to a file or a log)")
        if named is None:
            raise
        print(f"error: {named}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    finally:
        if isinstance(sys.stdout, NamedOutput):
            sys.stdout = sys.stdout.stream


class NamedOutput:
    """Standard output whose failing writes say so: a full device behind `> FILE` is one line naming it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        with self._named():
            return self.stream.write(text)

    def flush(self) -> None:
        with self._named():
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            named = storage_error(error, "writing to standard output", f"{storage_remedy(error)} where standard "
                                  "output goes (or redirect it elsewhere) and run the same command again")
            if named is None:
                raise  # a reader that went away (BrokenPipeError) is not a fault of the storage
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())  # what is left cannot fail again
            raise named from None
