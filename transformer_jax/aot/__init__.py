"""Ahead-of-time compilation: a run's real programs compiled for a TPU topology or GPUs on a host that has none.

`chips` (published HBM, bf16 peak and bandwidth per chip; a GPU's XLA target config) -> `topology`
(libtpu's compile-only devices for a slice, pod or several slices, or the CUDA plugin's for 1-8 GPUs
of one host; the (data, fsdp) mesh laid on them) -> `compile` (the
train step, dev-loss step and beam search of a run config, lowered from abstract shapes) -> `report`
(per-device memory against HBM, FLOPs against the analytic count, collectives, a roofline speed).
Command line: `python -m transformer_jax.aot --config=configs/wmt14_ende_base.py --topology=v5e:16x16`
(or `--topology=h100-8`).
"""

import importlib
from typing import Any

from transformer_jax.aot.chips import CHIPS, Chip
from transformer_jax.aot.topology import Topology, describe, mesh_for

# Loaded on first use: compiling a run loads the data pipeline and the training stack.
_LATER = {"compile_run": "compile", "run_programs": "compile", "verdict": "report", "table": "report",
          "PAPER_TOKENS_PER_STEP": "report", "plan_run": "plan"}


def __getattr__(name: str) -> Any:
    """The compile, report and plan functions, imported when first asked for."""
    if name in _LATER:
        return getattr(importlib.import_module(f"transformer_jax.aot.{_LATER[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CHIPS", "PAPER_TOKENS_PER_STEP", "Chip", "Topology", "compile_run", "describe", "mesh_for", "plan_run",
           "run_programs", "table", "verdict"]
