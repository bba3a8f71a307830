"""Compile a run's programs for a topology from abstract shapes alone: no parameters, no data.

The programs are the ones `train.py` runs, built by the same code (the model, optimizer and
train state of `training/`, the shardings of `run/sharding.py`, the jitted steps of
`training/jitted_steps.py`): the train step (or, with gradient accumulation, the micro-step and the
update), the dev-loss step and beam-search decoding, each lowered against ShapeDtypeStructs that
carry their shardings and compiled by the topology's own compiler (libtpu for TPUs, the CUDA plugin's XLA:GPU
for GPUs).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.data.batching import packed_batch_shape
from transformer_jax.evaluation.translate_split import translate_rows
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.run.config_schema import decode_options, model_config
from transformer_jax.run.sharding import abstract_with_shardings, batch_sharding, state_shardings
from transformer_jax.training.jitted_steps import jit_steps
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import create_train_state

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\]")


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

    @property
    def total_bytes(self) -> int:
        """Peak device memory of the program: arguments + outputs - aliased + temporaries + code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


def collectives_in(hlo_text: str) -> dict[str, tuple[int, int]]:
    """{op: (count, bytes)} of the collectives in optimized HLO text (async pairs counted once)."""
    found: dict[str, list[int]] = {}
    for line in hlo_text.splitlines():
        match = re.search(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
        if not match:
            continue
        shapes = [(dtype, dims) for dtype, dims in _SHAPE.findall(match.group(1))]
        if match.group(3) and match.group(2) != "all-reduce":
            # An async start's result is (operands..., outputs...): count the outputs. (all-reduce-start,
            # as XLA:GPU writes it, returns the outputs alone.)
            shapes = shapes[len(shapes) // 2:]
        size = sum(_DTYPE_BYTES.get(dtype, 4) * _product(dims) for dtype, dims in shapes)
        count_and_bytes = found.setdefault(match.group(2), [0, 0])
        count_and_bytes[0] += 1
        count_and_bytes[1] += size
    return {op: (count, size) for op, (count, size) in found.items()}


def _product(dims: str) -> int:
    result = 1
    for dim in filter(None, dims.split(",")):
        result *= int(dim)
    return result


def program_of(name: str, compiled: Any) -> Program:
    """Read memory, cost and collectives out of a compiled executable."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    if cost is None:  # the CUDA plugin's compile-only executables carry no cost analysis
        cost = host_cost_analysis(compiled)
    return Program(
        name, memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.alias_size_in_bytes,
        memory.temp_size_in_bytes, memory.generated_code_size_in_bytes,
        float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)), collectives_in(compiled.as_text()),
    )


def host_cost_analysis(compiled: Any) -> dict[str, float]:
    """XLA's HloCostAnalysis of the compiled program (optimized and partitioned: one device's), run by the host's
    CPU client: the same FLOP count and the post-fusion bytes accessed, by the CPU's cost model of each op."""
    from jax._src.lib import _jax  # no public API takes a compiled module to the cost analysis

    module = compiled.runtime_executable().hlo_modules()[0]
    return _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)


@dataclasses.dataclass(frozen=True)
class RunShapes:
    """What a step of the run processes: the model, the global batch and its row width."""

    model: TransformerConfig
    rows: int  # global rows of one micro-batch
    width: int  # tokens per row (source and target)
    eval_rows: int
    eval_width: int


def run_shapes(config: ml_collections.ConfigDict, mesh: Mesh) -> RunShapes:
    """The shapes `train.py` would feed on `mesh` (vocabulary: data.vocab_size, as the tokenizer is not trained)."""
    model = model_config(config, config.model.vocab_size or config.data.vocab_size)
    rows, width = packed_batch_shape(config.data.tokens_per_batch, config.data.max_length, mesh.size)
    # Dev/test batches: eval_batch_size sentences, rounded up so every device gets rows, at the longest bucket.
    eval_rows = -(-config.data.eval_batch_size // mesh.size) * mesh.size
    return RunShapes(model, rows, width, eval_rows, min(256, model.max_len))


PROGRAMS = ("train", "dev_loss", "decode")


def compile_run(config: ml_collections.ConfigDict, mesh: Mesh,
                which: tuple[str, ...] = PROGRAMS) -> tuple[RunShapes, list[Program]]:
    """Compile the train step(s), the dev-loss step and beam-search decoding of `config` on `mesh` (`which` of them)."""
    shapes = run_shapes(config, mesh)
    model = Transformer(shapes.model)
    training = config.training
    schedule = paper_learning_rate(shapes.model.d_model, training.warmup_steps, training.learning_rate_scale)
    optimizer = paper_optimizer(schedule, training.adam_b1, training.adam_b2, training.adam_eps,
                                training.grad_clip_norm or None)
    abstract_state = jax.eval_shape(lambda: create_train_state(model, optimizer, training.seed))
    shardings = state_shardings(mesh, abstract_state)
    state = abstract_with_shardings(abstract_state, shardings)
    steps = jit_steps(mesh, shardings, model.apply, training.label_smoothing, training.accumulation_steps,
                      place_micro_steps=False)
    programs = []
    if "train" in which:
        batch = abstract_batch(mesh, shapes.rows, shapes.width, packed=config.data.pack)
        programs += _compile_train(steps, state, batch, mesh, training.accumulation_steps)
    if "dev_loss" in which:
        eval_batch = abstract_batch(mesh, shapes.eval_rows, shapes.eval_width, packed=False)
        programs.append(_compile("dev loss", steps.eval_step, state.params, eval_batch))
    if "decode" in which:
        programs.append(_compile_decode(config, mesh, shapes, state.params))
    return shapes, programs


def _compile_train(steps: Any, state: Any, batch: dict[str, jax.ShapeDtypeStruct], mesh: Mesh,
                   accumulation: int) -> list[Program]:
    """The train step, or with accumulation the micro-step and the update (as Trainer.update runs them)."""
    if accumulation == 1:
        return [_compile("train step", steps.train_step, state, batch)]
    micro = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
    # The update's in_shardings place the gradient sums; their abstract shapes are enough here.
    grads = jax.eval_shape(steps.micro_gradients, state, batch, micro)
    return [_compile("micro-step gradients", steps.micro_gradients, state, batch, micro),
            _compile("apply accumulated gradients", steps.apply_gradients, state, *grads)]


def _compile_decode(config: ml_collections.ConfigDict, mesh: Mesh, shapes: RunShapes, params: Any) -> Program:
    """Beam search as the run decodes dev/test sets: each device searches its own rows, parameters whole."""
    options = decode_options(config)
    replicated = NamedSharding(mesh, PartitionSpec())
    params = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated),
                          nn.meta.unbox(params))
    src = jax.ShapeDtypeStruct((shapes.eval_rows, shapes.eval_width), jnp.int32, sharding=batch_sharding(mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    decode = jax.jit(lambda p, s, k: translate_rows(p, s, k, shapes.model, options, mesh))
    return _compile(f"beam search (beam {options.beam_size})", decode, params, src, key)


def abstract_batch(mesh: Mesh, rows: int, width: int, packed: bool) -> dict[str, jax.ShapeDtypeStruct]:
    """A training/eval batch as ShapeDtypeStructs split over the mesh's batch axes."""
    keys = ["inputs", "targets", "target_inputs"]
    if packed:
        keys += ["inputs_segmentation", "targets_segmentation", "inputs_position", "targets_position"]
    sharding = batch_sharding(mesh)
    return {key: jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=sharding) for key in keys}


def _compile(name: str, jitted: Callable, *args: Any) -> Program:
    return program_of(name, jitted.lower(*args).compile())
