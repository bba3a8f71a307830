"""Compile a run's programs for a topology from abstract shapes alone: no parameters, no devices.

The programs are the ones `train.py` runs, built by the same run builder (`run/programs.py`) on
a mesh made by the same function (`base/sharding.make_mesh`): the train step for every training batch
shape (or, with gradient accumulation, the micro-step and the update), the packed dev-loss step and
the search, each lowered against ShapeDtypeStructs that carry their shardings and compiled by the
topology's own compiler (libtpu for TPUs, the CUDA plugin's XLA:GPU for GPUs). The batch shapes are
those of the corpus prepared in a run directory (`workdir`), or rows of data.max_length.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh

from transformer_jax.aot.cycles import Estimate, estimate_of
from transformer_jax.base.console import say
from transformer_jax.base.sharding import mesh_platform
from transformer_jax.cli import training_workdir
from transformer_jax.config.schema import decode_options, decoding_dtype
from transformer_jax.data.pipeline import RunData, prepare_data
from transformer_jax.data.shapes import BatchShapes
from transformer_jax.model.config import TransformerConfig
from transformer_jax.run.programs import RunPrograms, build_run_for

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
HLO_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                   "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\]")
_COLLECTIVE = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program's per-device memory, cost and collectives."""

    name: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs that reuse (donated) argument buffers
    temp_bytes: int
    code_bytes: int
    flops: float  # per device, from XLA's cost analysis
    bytes_accessed: float  # per device, HBM traffic from XLA's cost analysis
    collectives: dict[str, tuple[int, int]]  # op -> (count, bytes of their results)
    attention_kernels: int = 0  # calls of an attention kernel (TPU Pallas splash, cuDNN flash attention)
    loss_kernels: int = 0  # calls of the fused loss kernels (training/loss_kernel.py)
    estimate: Estimate | None = None  # libtpu's cycle estimates (aot/cycles.py); None off TPUs
    splash_calls: tuple[int, int] = (0, 0)  # (forward, backward) splash kernel calls (splash_calls_in)

    @property
    def total_bytes(self) -> int:
        """Peak device memory of the program: arguments + outputs - aliased + temporaries + code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


def collectives_in(hlo_text: str) -> dict[str, tuple[int, int]]:
    """{op: (count, bytes)} of the collectives in optimized HLO text (async pairs counted once)."""
    found: dict[str, list[int]] = {}
    # The pattern's lazy prefix backtracks over each whole line: it is tried only on the few lines that name a
    # collective (47 of the 11,844 of the base model's one-layer train step on v5e-8; all lines cost the pod's
    # six-layer preflight about 4 s).
    for line in (line for line in hlo_text.splitlines() if any(op in line for op in COLLECTIVES)):
        match = _COLLECTIVE.search(line)
        if not match:
            continue
        shapes = [(dtype, dims) for dtype, dims in _SHAPE.findall(match.group(1))]
        if match.group(3) and match.group(2) != "all-reduce":
            # An async start's result is (operands..., outputs...): count the outputs. (all-reduce-start,
            # as XLA:GPU writes it, returns the outputs alone.)
            shapes = shapes[len(shapes) // 2:]
        size = sum(HLO_DTYPE_BYTES.get(dtype, 4) * _product(dims) for dtype, dims in shapes)
        count_and_bytes = found.setdefault(match.group(2), [0, 0])
        count_and_bytes[0] += 1
        count_and_bytes[1] += size
    return {op: (count, size) for op, (count, size) in found.items()}


def _product(dims: str) -> int:
    result = 1
    for dim in filter(None, dims.split(",")):
        result *= int(dim)
    return result


# XLA:GPU picks its Triton GEMMs' tiles by autotuning on the GPU; a compile-only one has none to autotune on and,
# for some shapes, finds no tiles at all ("Couldn't find output tile sizes", seen for the base model's dev-loss
# step on an H100 and an H200). Such a program is compiled again with the GEMMs by cuBLAS, which a GPU's own
# compile may pick as well: its memory is the program's, but XLA's cost model gives cuBLAS calls no FLOPs.
TRITON_TILES_FAILURE = "Couldn't find output tile sizes"
WITHOUT_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}


def compile_lowered(name: str, lowered: Any) -> Any:
    """`lowered.compile()`, or, where XLA's Triton GEMM finds no tiles compile-only, the same program with cuBLAS's
    GEMMs (said in one line)."""
    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        if TRITON_TILES_FAILURE not in str(error):
            raise
    say(f"{name}: XLA's Triton GEMM found no tiles for a matmul compile-only; compiled with cuBLAS's GEMMs instead "
        "(a GPU's own compile autotunes between the two; its FLOPs then leave out the GEMMs, which XLA's cost model "
        "does not count)")
    return lowered.compile(compiler_options=WITHOUT_TRITON_GEMM)


def program_of(name: str, compiled: Any) -> Program:
    """Read memory, cost and collectives out of a compiled executable."""
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    if cost is None:  # the CUDA plugin's compile-only executables carry no cost analysis
        cost = host_cost_analysis(compiled)
    return Program(
        name, memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.alias_size_in_bytes,
        memory.temp_size_in_bytes, memory.generated_code_size_in_bytes,
        float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)), collectives_in(text),
        attention_kernels_in(text), loss_kernels_in(text), estimate_of(text), splash_calls_in(text),
    )


def splash_calls_in(hlo_text: str) -> tuple[int, int]:
    """(forward, backward) calls of TPU splash attention in optimized HLO text: its forward kernel, and its
    dK/dV kernel (which also computes dQ when fused), one of each per attention a train step differentiates.
    More forward calls than backward ones mean layers that run their attention again in the backward pass
    (model.remat)."""
    calls = [line for line in hlo_text.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    return (sum("splash_mha_fwd" in line for line in calls), sum("splash_mha_dkv" in line for line in calls))


def attention_kernels_in(hlo_text: str) -> int:
    """How many attention-kernel calls optimized HLO text holds: Pallas TPU kernels other than the loss's (splash
    attention is the one the model uses) and cuDNN's fused attention."""
    return sum(1 for line in hlo_text.splitlines()
               if ('custom_call_target="tpu_custom_call"' in line and not _is_loss_kernel(line))
               or 'custom_call_target="__cudnn$fmha' in line)


def loss_kernels_in(hlo_text: str) -> int:
    """How many calls of the fused loss kernels optimized HLO text holds."""
    return sum(1 for line in hlo_text.splitlines()
               if 'custom_call_target="tpu_custom_call"' in line and _is_loss_kernel(line))


def _is_loss_kernel(line: str) -> bool:
    from transformer_jax.training.loss_kernel import KERNEL_NAMES

    return any(name in line for name in KERNEL_NAMES)


def host_cost_analysis(compiled: Any) -> dict[str, float]:
    """XLA's HloCostAnalysis of the compiled program (optimized and partitioned: one device's), run by the host's
    CPU client: the same FLOP count and the post-fusion bytes accessed, by the CPU's cost model of each op."""
    from jax._src.lib import _jax  # no public API takes a compiled module to the cost analysis

    module = compiled.runtime_executable().hlo_modules()[0]
    return _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)


@dataclasses.dataclass(frozen=True)
class RunShapes:
    """What the report needs of a run's shapes: the model, and the largest training batch (rows x width)."""

    model: TransformerConfig
    rows: int  # global rows of the largest micro-batch
    width: int  # its tokens per row (source and target)
    batches: BatchShapes | None = None  # every shape the programs were compiled for


PROGRAMS = ("train", "dev_loss", "decode")


def run_data(config: ml_collections.ConfigDict, mesh: Mesh, workdir: str | None = None) -> RunData | None:
    """The corpus train.py would read, when there is one: data.prepared, or `workdir`'s (prepared there as
    train.py does, reusing what is already there, while holding the workdir's lock); else None."""
    if workdir:
        with training_workdir(workdir):  # created if new; owned, as a train.py on it may be preparing it too
            return prepare_data(config, workdir, row_multiple=mesh.size, platform=mesh_platform(mesh))
    if config.data.prepared:
        return prepare_data(config, None, row_multiple=mesh.size, platform=mesh_platform(mesh))
    return None


def run_programs(config: ml_collections.ConfigDict, mesh: Mesh, workdir: str | None = None,
                 data: RunData | None = None) -> RunPrograms:
    """The run builder's programs of `config` on `mesh`, for the batch shapes train.py would feed.

    The shapes are those of `data`, or of the corpus `run_data` finds (data.prepared, or `workdir`'s);
    without a corpus, rows of data.max_length, and the vocabulary is data.vocab_size (no tokenizer is trained).
    """
    return build_run_for(config, mesh, data or run_data(config, mesh, workdir))


def run_shapes(programs: RunPrograms) -> RunShapes:
    """The report's view of the built run's shapes."""
    rows, width = max(programs.shapes.train, key=lambda shape: shape[0] * shape[1])
    return RunShapes(programs.model_config, rows, width, programs.shapes)


def compile_run(config: ml_collections.ConfigDict, mesh: Mesh, which: tuple[str, ...] = PROGRAMS,
                workdir: str | None = None, programs: RunPrograms | None = None) -> tuple[RunShapes, list[Program]]:
    """Compile `which` of the run's programs on `mesh` (`programs`, or those of `run_programs`): the train
    step(s), the dev-loss step and the search the run decodes dev/test sets with; returns the shapes and
    the compiled figures."""
    programs = programs or run_programs(config, mesh, workdir)
    lowered = []
    if "train" in which:
        lowered += programs.lower_train()
    if "dev_loss" in which:
        lowered += programs.lower_dev_loss()
    if "decode" in which:
        lowered.append(programs.lower_search(decode_options(config), decoding_dtype(config)))
    return run_shapes(programs), [program_of(name, compile_lowered(name, program)) for name, program in lowered]
