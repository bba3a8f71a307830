"""What train.py and eval.py share: one-line errors for mistakes a user can make, and workdir checks."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from transformer_jax.errors import (
    ConfigError,
    UserError,
)
from transformer_jax.run.files import is_local, make_dirs, remove, unique_name, write_atomically

# Exit status of a run stopped by a user error (bad flag, config value, data, checkpoint).
USER_ERROR_EXIT = 2


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError into one line on stderr and exit status 2; any other exception is a bug and keeps its traceback."""
    try:
        yield
    except UserError as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing where a bad flag, config file or --config override is one line and exit status 2."""
    from absl import flags

    try:
        remaining = flags.FLAGS(argv)
        if "config" in flags.FLAGS:
            getattr(flags.FLAGS.config, "keys")  # a config file loads lazily: fail here, not mid-run
        return remaining
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as error:
        # ml_collections writes "'key'\nDid you mean ..." and multi-line file errors: keep one line.
        lines = [line.strip() for line in str(error).replace("\\n", "\n").splitlines() if line.strip()]
        detail = " ".join(lines[-2:] if isinstance(error, OSError) else lines).replace("'", "").replace("\\", "")
        print(f"error: invalid command line: {detail}; see --help and configs/", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)


def initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                           process_id: int | None) -> None:
    """Join a multi-process run (jax.distributed.initialize); a wrong setting is one ConfigError line.

    On CPU the processes exchange data with JAX's default CPU collectives (gloo over TCP).
    """
    import jax

    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    except (ValueError, RuntimeError) as error:
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"cannot join the multi-process run ({detail}); on a cluster without auto-detection pass "
            "--coordinator_address=HOST:PORT --num_processes=N --process_id=I"
        ) from None


def ensure_writable_workdir(workdir: str) -> None:
    """Create `workdir` if needed; fail clearly when it cannot be written."""
    try:
        make_dirs(workdir)
        # Unique per process and host: hosts sharing the workdir may run processes with equal pids.
        probe = unique_name(os.path.join(workdir, ".write_test"))
        if is_local(probe):
            with open(probe, "w") as f:
                f.write("ok")
        else:
            write_atomically(probe, "ok")  # one object upload: no temporary object to leave behind
        remove(probe)
    except OSError as error:
        raise ConfigError(
            f"workdir {workdir} is not writable ({error.strerror or error}); choose another --workdir"
        ) from None
