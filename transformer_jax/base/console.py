"""What train.py and eval.py print: progress bars, the few lines a user needs, and warnings only when something is wrong.

By default absl and Python logging show WARNING and above, so Orbax's INFO lines stay out, and the
"Event loop is closed" reports that asyncio clients' finalizers raise at interpreter exit (after the
run's work is done) are dropped. absl's `--verbosity=0` (INFO) or higher brings all of it back.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

CLOSED_LOOP = "Event loop is closed"


def _is_closed_loop(error: BaseException | None) -> bool:
    return isinstance(error, RuntimeError) and str(error) == CLOSED_LOOP


class _DropClosedLoop(logging.Filter):
    """Drops asyncio's reports of callbacks that ran into a closed event loop."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (_is_closed_loop(error) or CLOSED_LOOP in record.getMessage())


def skip_absent_tpu() -> None:
    """On a host without TPU chips, keep JAX from starting libtpu, which the `tpu` extra installs for the
    preflight and whose start-up there prints errors about TPU worker hostnames on every run.

    JAX then starts CUDA (when an NVIDIA GPU and JAX's CUDA plugin are present) and the CPU. An explicit
    JAX_PLATFORMS (or JAX_FORCE_TPU_INIT) is left alone; on a TPU VM nothing changes.
    """
    import importlib.util

    if os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ or importlib.util.find_spec("libtpu") is None:
        return
    try:
        from jax._src import hardware_utils  # the PCI scan JAX's own TPU start-up does
    except ImportError:
        return
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
        return
    import jax

    cuda = hardware_utils.has_visible_nvidia_gpu() and any(
        importlib.util.find_spec(plugin) for plugin in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
    jax.config.update("jax_platforms", "cuda,cpu" if cuda else "cpu")


def quiet_console() -> None:
    """Unless `--verbosity` was given: logging at WARNING, closed-event-loop reports at exit dropped.
    Always: libtpu is not started on a host without TPU chips (skip_absent_tpu).

    Call it in main(), after absl parsed the flags, before any JAX work.
    """
    from absl import flags
    from absl import logging as absl_logging

    skip_absent_tpu()

    if "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present:
        return
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("asyncio").addFilter(_DropClosedLoop())
    previous_hook = sys.unraisablehook

    def unraisable(report: Any) -> None:
        if not _is_closed_loop(report.exc_value):
            previous_hook(report)

    sys.unraisablehook = unraisable


def say(message: str) -> None:
    """Print one line for the user on process 0 (above any progress bar, without breaking it)."""
    import jax
    from tqdm import tqdm

    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stdout)


def plain_lines(stream: Any = None) -> bool:
    """Whether progress goes to `stream` (standard error) as plain lines: it is not a terminal (a log file, a
    scheduler's capture), where a carriage-return bar would become one endless line."""
    stream = sys.stderr if stream is None else stream
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return True
