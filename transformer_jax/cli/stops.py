"""How a command ends: Ctrl-C and SIGTERM as one line and their exit status, and the process's own exit.

A command stopped by a signal may leave XLA work it was waiting on (a compile, an execution) running in
XLA's own threads. Python's shutdown would then destroy JAX's client under that work (a segmentation
fault at exit, status 139), and it resets the signal handlers before that teardown, so a SIGTERM in those
last moments would kill the process with no line. So `run_command` ends every command itself:
a stopped one exits at once after its line, a finished one after Python's exit work (threads joined,
atexit handlers run) with its handlers still answering.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
import types
from typing import Callable, Iterator, NoReturn

from transformer_jax.base import announce_end, await_verdict_if_lost_peer, stop_coordination_service
from transformer_jax.cli.flag_parsing import parse_flags
from transformer_jax.cli.user_errors import INTERRUPTED_EXIT, TERMINATED_EXIT
from transformer_jax.early_signals import ARRIVED, record

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Terminated(BaseException):
    """SIGTERM arrived outside the training loop (which saves a checkpoint and stops by itself)."""


class Stopped(SystemExit):
    """A command ended by a signal, its line printed: `run_command` exits without Python's shutdown."""


# A stop a handler raised, until `interrupts_reported` has acted on it. An exception raised by a signal
# handler is lost when it lands in a callback Python runs for itself (a garbage-collection callback of
# JAX, a __del__): Python prints "Exception ignored in ..." and goes on. So a raising handler also sends
# the signal again after RESEND_AFTER_S while nothing has acted on it; the next one lands elsewhere (or
# in the training loop's own handler, which stops at a step boundary with a checkpoint).
_unanswered: list[int] = []
RESEND_AFTER_S = 1.0

# SIGTERM/SIGINT that arrived before the command's work began (while its imports ran, which take seconds),
# recorded from the entry point's first instruction (transformer_jax/early_signals.py); `interrupts_reported` acts
# on them.
_arrived_early = ARRIVED


def early_signals() -> list[int]:
    """Record SIGTERM and SIGINT from now until `interrupts_reported` starts (a signal the process was
    started ignoring stays ignored: a shell's background job ignores SIGINT); returns the list they go to."""
    return record()


def _resend_if_unanswered(signal_number: int) -> None:
    if signal_number in _unanswered:
        os.kill(os.getpid(), signal_number)


def _raise_stop(signal_number: int, frame: object) -> None:
    _unanswered.append(signal_number)
    timer = threading.Timer(RESEND_AFTER_S, _resend_if_unanswered, args=(signal_number,))
    timer.daemon = True
    timer.start()
    raise Terminated() if signal_number == signal.SIGTERM else KeyboardInterrupt()


def _quiet_lost_stops(report: object, previous: Callable[[object], None]) -> None:
    """sys.unraisablehook while stops are reported: a stop our handler raised where Python drops it (a gc
    callback of JAX's, a __del__) is not printed ("Exception ignored in ... KeyboardInterrupt"): it is sent again
    (`_raise_stop`), and then answered with the command's one line. Anything else is reported as before."""
    if _unanswered and isinstance(getattr(report, "exc_value", None), (KeyboardInterrupt, Terminated)):
        return
    previous(report)


def _handled_signals(handler: Callable) -> dict:
    """Install `handler` for SIGTERM and SIGINT; returns the handlers it replaced. A signal the command was
    started ignoring stays ignored (a shell's background job ignores SIGINT)."""
    return {number: signal.signal(number, handler) for number in STOP_SIGNALS
            if signal.getsignal(number) is not signal.SIG_IGN}


@contextlib.contextmanager
def interrupts_reported(finished: Callable[[], str], terminated_exit: int = TERMINATED_EXIT,
                        resumable: bool = False) -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM end the command with one line saying what was finished.

    Ctrl-C exits with status 130. SIGTERM (what a preempted VM or a cluster scheduler sends) stops the
    command wherever it is (start-up, data preparation, compiling, translating) with `terminated_exit` (143,
    the signal's own status: a scheduler restarts a job that did not finish); `resumable` (train.py) says that
    the same command resumes. The training loop takes SIGTERM over while it runs (it saves a checkpoint and
    stops at a step boundary), then gives it back. Unwinding releases the run lock; every file is written
    atomically, so nothing is left half written. The exit is a `Stopped` (a SystemExit).
    SIGTERM/SIGINT that arrived while the command's imports ran (they take seconds; transformer_jax/early_signals.py
    records them): the command stops here with its line, as if they had arrived now.
    """
    def stop(signal_number: int) -> NoReturn:
        _unanswered.clear()
        if signal_number == signal.SIGINT:
            print(f"interrupted: {finished()}", file=sys.stderr)
            raise Stopped(INTERRUPTED_EXIT) from None
        resumes = "; the same command resumes the run" if resumable else ""
        print(f"stopped by SIGTERM: {finished()}{resumes}", file=sys.stderr)
        raise Stopped(terminated_exit) from None

    previous = _handled_signals(_raise_stop)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = quiet = functools.partial(_quiet_lost_stops, previous=previous_hook)
    try:
        for number in _arrived_early:
            _raise_stop(number, None)
        yield
    except KeyboardInterrupt:
        stop(signal.SIGINT)
    except Terminated:
        stop(signal.SIGTERM)
    else:
        # A stop raised inside a callback Python ran for itself (JAX's, during a compile) is lost there, and its
        # resend may come after the work: the signal arrived while the command worked, so it is acted on now.
        if _unanswered:
            stop(_unanswered[0])
    finally:
        if sys.unraisablehook is quiet:  # else a hook installed since chains to it (it passes reports on)
            sys.unraisablehook = previous_hook
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (sent again on leaving), so that what the block does is done whole.

    Held by the handlers, not by a signal mask: a process signal goes to any thread not masking it, and
    JAX's threads were started before the block."""
    arrived: list[int] = []
    previous = _handled_signals(lambda number, frame: arrived.append(number))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(arrived):
            os.kill(os.getpid(), number)  # to the handlers just restored


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the descriptor closed (`>&-`): Python has no stream for it
            continue
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream has nothing left to say
            stream.flush()


def end_process(code: int | str | None) -> NoReturn:
    """Exit with `code` after Python's exit work (threads joined, atexit handlers run), skipping the
    interpreter's teardown; a signal meanwhile is named in one line (the command's work was finished)."""
    arrived: list[int] = []
    _handled_signals(lambda number, frame: arrived.append(number))
    announce_end(code if isinstance(code, int) else 0 if code is None else 1)  # to the run's other processes
    threading._shutdown()  # what Python's own exit does first: joins non-daemon threads (Orbax's writers)
    atexit._run_exitfuncs()
    stop_coordination_service()  # JAX's shutdown barrier (an exit function) passed: every process is done with it
    if arrived:
        name = signal.Signals(arrived[0]).name
        print(f"{name} arrived as the command was exiting; it had finished, and all it printed was written",
              file=sys.stderr)
    if isinstance(code, str):  # sys.exit("message"): printed, status 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    _flush_standard_streams()
    os._exit(code or 0)


def run_command(main: Callable[[list[str]], None], argv: list[str] | None = None,
                module: types.ModuleType | None = None) -> NoReturn:
    """absl's app.run of `main` with this project's flag parsing (`parse_flags`), ended by the process itself:
    at once after a stop's line (`Stopped`), else by `end_process`. A bug's traceback is Python's own; a
    collective broken by the death of another process ends in the peer watch's line (base/peer_watch.py).
    `module`: the command's module, whose docstring and flags `--help` prints (else the script's)."""
    from absl import app

    try:
        app.run(main, argv=argv, flags_parser=functools.partial(parse_flags, module=module))
    except Stopped as stop:
        announce_end(stop.code)
        _flush_standard_streams()
        os._exit(stop.code)
    except SystemExit as exit_:
        end_process(exit_.code)
    except Exception as error:  # a collective another process's death broke: the peer watch's line, not this
        await_verdict_if_lost_peer(error)
        raise
    end_process(0)
