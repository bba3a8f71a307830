"""SIGTERM and SIGINT that arrive while a command's modules are imported (seconds), kept to be acted on once it runs.

Every entry point records them from its first instruction, this package's first line (`record_if_command`): the
`transformer-jax` console script, `python -m transformer_jax`, and a checkout's train.py and eval.py. `transformer_jax.cli.stops.interrupts_reported` then acts on what arrived (one line, exit 143 or 130).
A library that imports the package is left alone: its signals keep their handlers. Standard library only: this
runs before JAX is imported.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["ARRIVED", "is_command", "record", "record_if_command"]

ARRIVED: list[int] = []  # the signals, in the order they came
COMMAND = "transformer-jax"
# A checkout's scripts, beside this package's folder: the command's forms with older flags.
SCRIPTS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), name)
                for name in ("train.py", "eval.py"))
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def record() -> list[int]:
    """Record SIGTERM and SIGINT in ARRIVED from now until a command's handlers replace these (a signal the process
    was started ignoring stays ignored: a shell's background job ignores SIGINT); returns ARRIVED."""
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, lambda number, frame: ARRIVED.append(number))
    return ARRIVED


def is_command(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> bool:
    """Whether this process is the `transformer-jax` command: its console script, `python -m transformer_jax`, or
    the checkout's train.py or eval.py (by their real paths: another program of that name is not)."""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    if argv and (os.path.basename(argv[0]) == COMMAND or os.path.realpath(argv[0]) in SCRIPTS):
        return True
    if "-m" in orig_argv[:-1]:
        return orig_argv[orig_argv.index("-m") + 1] in ("transformer_jax", "transformer_jax.__main__")
    return False


def record_if_command() -> None:
    """`record` when this process is the command (`is_command`), from the package's first line."""
    if is_command():
        record()
