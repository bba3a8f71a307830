"""A TPU slice, pod or set of slices, or a GPU host, described on a host that has none; a mesh laid out on it.

`libtpu` (the `tpu` extra: `pip install "transformer_jax[tpu]"`) describes any TPU topology to JAX as
compile-only devices, so `jit(...).lower(...).compile()` against them produces the real TPU program.
Topologies are named as libtpu names them (`v5e:16x16`: chips along each torus axis) or by their
Cloud accelerator type (`v5e-256`; v4 and v5p types count TensorCores, two per chip).

GPUs are named by chip and count on one host (`h100` or `h100-1`, `h100-2`, `h100-4`, `h100-8`; `h200`
alike).
JAX's CUDA plugin (`pip install "jax[cuda12]==<the installed jax version>"`, ~5 GB; for compiling alone
`pip install --no-deps jax-cuda12-plugin==<version> jax-cuda12-pjrt==<version>`, ~180 MB) builds their
compile-only devices from the GPU's stored target config (chips.gpu_target_config); the process must
not look for a local GPU (JAX_PLATFORMS=cpu, which the aot command sets).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

import jax
from jax.sharding import Mesh

from transformer_jax.aot.chips import CHIPS, Chip, chip_for, gpu_target_config
from transformer_jax.errors import ConfigError
from transformer_jax.base.sharding import make_mesh

# Compile-only use touches no chip, so several processes may load libtpu at once (it otherwise takes a
# lock file that a second process, e.g. this command run from a test, cannot get).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _cloud_types() -> dict[str, str]:
    """Cloud accelerator types -> libtpu topology names, for the common slice shapes."""
    types = {}
    for version in ("v5e", "v6e"):  # one TensorCore per chip; the type counts chips
        for shape in ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"):
            types[f"{version}-{math.prod(map(int, shape.split('x')))}"] = f"{version}:{shape}"
    for version in ("v4", "v5p"):  # two TensorCores per chip; the type counts TensorCores
        for shape in ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16"):
            types[f"{version}-{2 * math.prod(map(int, shape.split('x')))}"] = f"{version}:{shape}"
    return types


CLOUD_TYPES = _cloud_types()

# GPU machines: name -> (chip, GPUs on the one host).
GPU_TYPES: dict[str, tuple[str, int]] = {
    f"{chip}-{count}": (chip, count) for chip in ("h100", "h200") for count in (1, 2, 4, 8)} | {
    "h100": ("h100", 1), "h200": ("h200", 1)}


# TPU versions with chip data (chips.CHIPS): the only ones a topology may name, since a report needs the chip's figures.
TPU_VERSIONS = tuple(key for key, chip in CHIPS.items() if not chip.is_gpu)
# A libtpu topology name (`v5e:16x16`, `v4:4x4x4`: chips along each torus axis) or a Cloud type (`v5e-256`).
_TPU_NAME = re.compile(rf"(?:{'|'.join(map(re.escape, TPU_VERSIONS))})(?::[1-9][0-9]*(?:x[1-9][0-9]*){{1,2}}|-[1-9][0-9]*)")


def topology_forms() -> str:
    """The names --topology takes, in words, for a message."""
    return (f"a TPU topology as VERSION:AxB or VERSION:AxBxC (chips along each axis; VERSION one of "
            f"{', '.join(TPU_VERSIONS)}: e.g. v5e:16x16, v4:4x4x4, v5p:4x4x8, v6e:8x8), a Cloud type as "
            f"VERSION-N (e.g. v5e-256, v5p-128), or GPUs: {', '.join(sorted(GPU_TYPES))}")


def check_name(name: str) -> None:
    """Refuse (ConfigError) a topology `name` that is none of the forms of topology_forms: a misspelling is named
    as such here, before libtpu or a CUDA plugin is looked for."""
    if name not in GPU_TYPES and not _TPU_NAME.fullmatch(name):
        raise ConfigError(f"unknown topology {name!r}; use {topology_forms()}")


@dataclasses.dataclass(frozen=True)
class Topology:
    """Compile-only devices of a TPU topology or a GPU host, and what they stand for."""

    name: str  # as libtpu names it, e.g. "v5e:16x16"; for GPUs as GPU_TYPES does, e.g. "h100-8"
    devices: tuple[jax.Device, ...]
    chip: Chip
    num_slices: int

    @property
    def hosts(self) -> int:
        """Host processes (TPU VMs) that drive these devices."""
        return len({(getattr(d, "slice_index", 0), d.process_index) for d in self.devices})

    @property
    def chips(self) -> int:
        """Physical chips (a v4 chip may show as two devices, one per TensorCore)."""
        return len(self.devices) * self._cores_per_device // self.chip.tensorcores

    @property
    def _cores_per_device(self) -> int:
        """TensorCores one JAX device stands for (1 for a GPU)."""
        return 1 if self.chip.is_gpu else self.devices[0].num_cores

    @property
    def hbm_bytes_per_device(self) -> int:
        """The memory one device (one JAX device: a chip, or a TensorCore of a two-core chip) owns."""
        return self.chip.hbm_bytes * self._cores_per_device // self.chip.tensorcores

    @property
    def peak_flops_per_device(self) -> float:
        """Peak bf16 FLOP/s of one device."""
        return self.chip.peak_bf16_flops * self._cores_per_device / self.chip.tensorcores

    @property
    def hbm_bandwidth_per_device(self) -> float:
        """HBM bytes per second of one device."""
        return self.chip.hbm_bytes_per_second * self._cores_per_device / self.chip.tensorcores


def describe(name: str, num_slices: int = 1) -> Topology:
    """The topology `name` (libtpu name, Cloud type or GPU_TYPES name), `num_slices` copies of it joined by DCN.

    Raises ConfigError for an unknown name (check_name), or a missing libtpu or CUDA plugin.
    """
    if num_slices < 1:
        raise ConfigError(f"--num_slices={num_slices} must be at least 1 (the slices joined by the data-center network)")
    check_name(name)
    if name in GPU_TYPES:
        return _describe_gpus(name, num_slices)
    topology_name = CLOUD_TYPES.get(name, name)
    try:
        import libtpu  # noqa: F401  (the compiler JAX loads for TPU topologies)
    except ImportError:
        raise ConfigError(f"compiling for the TPU topology {name} needs libtpu, which is not installed; pip install "
                          "'transformer-jax[tpu]' (or 'jax[tpu]' of the installed jax version)") from None
    from jax.experimental import topologies

    try:
        described = topologies.get_topology_desc(platform="tpu", topology_name=topology_name,
                                                 **({"num_slices": num_slices} if num_slices > 1 else {}))
    except Exception as error:  # noqa: BLE001 - libtpu reports bad names as runtime errors
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "INVALID_ARGUMENT" not in detail:
            raise
        raise ConfigError(f"unknown TPU topology {name!r} ({detail}); use {topology_forms()}") from None
    devices = tuple(described.devices)
    chip = chip_for(devices[0].device_kind)
    if chip is None:
        raise ConfigError(f"no chip data for {devices[0].device_kind!r} (topology {name!r}); "
                          "add it to transformer_jax/aot/chips.py")
    return Topology(topology_name, devices, chip, num_slices)


# JAX's CUDA plugins (jax[cuda12], jax[cuda13]): either builds compile-only GPU devices.
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def cuda_plugin_missing() -> str | None:
    """Why GPU topologies cannot be described here (a one-line fix), or None when they can."""
    if importlib.util.find_spec("jax_plugins") is None or all(
            importlib.util.find_spec(plugin) is None for plugin in CUDA_PLUGINS):
        version = jax.__version__
        return (f"compiling for GPUs needs a CUDA plugin of JAX: pip install 'jax[cuda12]=={version}' (or jax[cuda13]; "
                f"about 5 GB with CUDA's libraries), or for compiling alone pip install --no-deps "
                f"jax-cuda12-plugin=={version} jax-cuda12-pjrt=={version} (about 180 MB); no GPU needed either way; "
                "then run with JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1")
    if jax.config.jax_platforms != "cpu":
        return ("compile-only GPU devices need JAX to use no local accelerator: run with JAX_PLATFORMS=cpu "
                f"JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (JAX_PLATFORMS is {jax.config.jax_platforms!r})")
    return None


def _describe_gpus(name: str, num_slices: int) -> Topology:
    """`name`'s GPUs on one host, as compile-only devices built from the GPU's stored target config."""
    if num_slices != 1:
        raise ConfigError(f"--num_slices={num_slices}: GPU topologies are one host ({name}); use num_slices=1")
    missing = cuda_plugin_missing()
    if missing:
        raise ConfigError(missing)
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # the CUDA libraries' checks need a GPU
    from jax.experimental import topologies

    chip_key, count = GPU_TYPES[name]
    chip = CHIPS[chip_key]
    # The CUDA plugin's topology is "<slices>x<hosts>x<GPUs per host>".
    described = topologies.get_topology_desc(platform="cuda", target_config=gpu_target_config(chip),
                                             topology=f"1x1x{count}")
    return Topology(name, tuple(described.devices), chip, 1)


def host_devices(topology: Topology) -> list[jax.Device]:
    """The devices of the topology's first host process: what one process of a job that runs on each host alone
    (`translate-corpus`) has as its local devices."""
    def host(device: jax.Device) -> tuple[int, int]:
        return getattr(device, "slice_index", 0), device.process_index

    first = min(host(device) for device in topology.devices)
    return [device for device in topology.devices if host(device) == first]


def mesh_for(topology: Topology, data: int, fsdp: int) -> Mesh:
    """The run's (data, fsdp) mesh (base.sharding.make_mesh, as train.py builds it) over the topology's devices."""
    return make_mesh(data, fsdp, topology.devices, topology.num_slices, where=topology.name)
