"""Ahead-of-time compilation: a run's real programs compiled for a TPU topology or GPUs on a host that has none.

`chips` (published HBM, bf16 peak and bandwidth per chip; a GPU's XLA target config) -> `topology`
(libtpu's compile-only devices for a slice, pod or several slices, or the CUDA plugin's for 1-8 GPUs
of one host; the (data, fsdp) mesh laid on them) -> `cycles` (libtpu's cycle estimates) -> `compile` (the
train step, dev-loss step and beam search of a run config, lowered from abstract shapes) -> `report`
(per-device memory against HBM, FLOPs against the analytic count, collectives, a roofline speed of training and
of translating) -> `measured` (step times measured on accelerators, beside the predictions) -> `host_input` (a
host's input time per update) -> `plan` (`plan_run`: config and topology in, the report and its verdict out) ->
`preflight` (the command).
Command line: `python -m transformer_jax.aot --config=configs/wmt14_ende_base.py --topology=v5e:16x16`
(or `--topology=h100-8`).
"""

from transformer_jax.aot.chips import CHIPS, Chip
from transformer_jax.aot.compile import HLO_DTYPE_BYTES, compile_run, program_of, run_programs
from transformer_jax.aot.plan import plan_run
from transformer_jax.aot.report import PAPER_TOKENS_PER_STEP, program_seconds, splash_flops, table, verdict
from transformer_jax.aot.topology import Topology, describe, mesh_for

__all__ = [
    "CHIPS",
    "HLO_DTYPE_BYTES",
    "PAPER_TOKENS_PER_STEP",
    "Chip",
    "Topology",
    "compile_run",
    "describe",
    "mesh_for",
    "plan_run",
    "program_of",
    "program_seconds",
    "run_programs",
    "splash_flops",
    "table",
    "verdict",
]
