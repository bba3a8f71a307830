"""Ahead-of-time compilation: a run's real programs compiled for a TPU topology or GPUs on a host that has none.

`chips` (published HBM, bf16 peak and bandwidth per chip; a GPU's XLA target config) -> `topology`
(libtpu's compile-only devices for a slice, pod or several slices, or the CUDA plugin's for 1-8 GPUs
of one host; the (data, fsdp) mesh laid on them) -> `compile` (the
train step, dev-loss step and beam search of a run config, lowered from abstract shapes) -> `report`
(per-device memory against HBM, FLOPs against the analytic count, collectives, a roofline speed).
Command line: `python -m transformer_jax.aot --config=configs/wmt14_ende_base.py --topology=v5e:16x16`
(or `--topology=h100-8`).
"""

from transformer_jax.aot.chips import CHIPS, Chip
from transformer_jax.aot.topology import Topology, describe, mesh_for

__all__ = ["CHIPS", "Chip", "Topology", "describe", "mesh_for"]
