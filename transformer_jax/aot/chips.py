"""Accelerator chips: memory, peak bf16 throughput and memory bandwidth, as their makers publish them.

One place for these figures; the ahead-of-time report compares compiled programs against them.
Sources (checked 2026-11-23): Google Cloud TPU system-architecture pages for v4, v5e, v5p and v6e
(docs.cloud.google.com/tpu/docs/<version>), NVIDIA's H100 Tensor Core GPU datasheet (SXM5) and H200 datasheet
(SXM: 141 GB HBM3e at 4.8 TB/s; the H100's chip, so the H100 SXM's 989 dense bf16 TFLOP/s).

A GPU also needs what XLA compiles for (compute capability, cores, shared memory, cuDNN version):
its GpuTargetConfig, stored as text under gpu_specs/. gpu_specs/h100_sxm.txtpb is XLA's own
xla/backends/gpu/target_config/specs/h100_sxm.txtpb (github.com/openxla/xla, Apache 2.0);
gpu_specs/h200_sxm.txtpb is the same with the H200's memory.
"""

from __future__ import annotations

import dataclasses
import importlib.resources

GB = 10**9
GIB = 2**30
TFLOPS = 10**12


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip as its maker specifies it."""

    name: str
    hbm_bytes: int  # memory per chip
    peak_bf16_flops: float  # dense bf16 matrix throughput per chip, FLOP/s
    hbm_bytes_per_second: float
    tensorcores: int  # TPU TensorCores per chip (1 for a GPU)
    source: str
    gpu_target_config: str = ""  # for a GPU: its GpuTargetConfig file under gpu_specs/
    mxus_per_core: int = 0  # TPU: matrix units per TensorCore
    mxu_width: int = 128  # TPU: a matrix unit multiplies mxu_width x mxu_width tiles

    @property
    def clock_hz(self) -> float:
        """A TPU TensorCore's clock, from the published figures: peak = cores x MXUs x width^2 x 2 FLOPs per
        cycle (v4: 1.05 GHz, as Google's v4 paper gives it; v5e: 1.50; v5p and v6e: 1.75); 0 for a GPU."""
        if not self.mxus_per_core:
            return 0.0
        return self.peak_bf16_flops / (self.tensorcores * self.mxus_per_core * self.mxu_width**2 * 2)

    @property
    def is_gpu(self) -> bool:
        """True for a GPU (compiled by the CUDA plugin), False for a TPU (compiled by libtpu)."""
        return bool(self.gpu_target_config)


CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 32 * GIB, 275 * TFLOPS, 1200 * GB, 2, "Cloud TPU docs: TPU v4", mxus_per_core=4),
    "v5e": Chip("TPU v5e", 16 * GB, 197 * TFLOPS, 819 * GB, 1, "Cloud TPU docs: TPU v5e", mxus_per_core=4),
    "v5p": Chip("TPU v5p", 95 * GB, 459 * TFLOPS, 2765 * GB, 2, "Cloud TPU docs: TPU v5p", mxus_per_core=4),
    "v6e": Chip("TPU v6e (Trillium)", 32 * GB, 918 * TFLOPS, 1638 * GB, 1, "Cloud TPU docs: TPU v6e",
                mxus_per_core=4, mxu_width=256),
    "h100": Chip("NVIDIA H100 SXM5", 80 * GB, 989 * TFLOPS, 3350 * GB, 1, "NVIDIA H100 datasheet (dense bf16)",
                 gpu_target_config="h100_sxm.txtpb"),
    "h200": Chip("NVIDIA H200 SXM", 141 * GB, 989 * TFLOPS, 4800 * GB, 1,
                 "NVIDIA H200 datasheet (the H100 SXM's tensor cores, dense bf16)", gpu_target_config="h200_sxm.txtpb"),
}

# What JAX's compile-only devices report as `device_kind`, to the chip above.
DEVICE_KINDS: dict[str, str] = {
    "TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e",
    "NVIDIA H100 80GB HBM3": "h100", "H100": "h100", "NVIDIA H200": "h200", "NVIDIA H200 141GB HBM3e": "h200",
}


def chip_for(device_kind: str) -> Chip | None:
    """The chip whose devices report `device_kind`, or None when it is not in the table."""
    key = DEVICE_KINDS.get(device_kind)
    if key is None:
        key = next((chip for chip in ("h100", "h200") if chip.upper() in device_kind), None)
    return CHIPS.get(key) if key else None


def gpu_target_config(chip: Chip) -> str:
    """The GpuTargetConfig (protobuf text) XLA compiles for on `chip`, a GPU."""
    return importlib.resources.files("transformer_jax.aot").joinpath("gpu_specs", chip.gpu_target_config).read_text()
