"""The run builder: from a run config, a device mesh and the batch shapes, every program of the run.

train.py's Trainer, the preflight (`python -m transformer_jax.aot`) and the benchmarks build a
run here, so they compile the same programs: `build_run` gives the model, the train state's abstract
shapes and shardings, the jitted train step (or, with gradient accumulation, the micro-step and the
update), the dev-loss step (training/dev_loss.py's, which the score command uses too) and the search,
and lowers each of them for the run's batch shapes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from transformer_jax.base.sharding import (
    abstract_with_shardings,
    batch_sharding,
    host_cpu_device,
    mesh_platform,
    place_whole,
    state_shardings,
)
from transformer_jax.config.schema import model_config as run_model_config
from transformer_jax.config.schema import translation_batching
from transformer_jax.data.shapes import (
    PACKED_KEYS,
    BatchShapes,
    TranslationBatching,
    nominal_batch_shapes,
    translation_rows,
)
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.translate import decoding_precision, translate_rows
from transformer_jax.errors import ConfigError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.flops import parameter_count
from transformer_jax.model.transformer import Transformer
from transformer_jax.run.memory import check_fits, compiled_bytes_per_device, state_bytes_per_device
from transformer_jax.training.loss import projected_loss_for
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer, peak_scale
from transformer_jax.training.dev_loss import dev_loss_step
from transformer_jax.training.state import TrainState, create_train_state
from transformer_jax.training.step import (
    add_trees,
    apply_gradients,
    compute_gradients,
    norm_by_for,
    skip_by_for,
    train_step,
)

if TYPE_CHECKING:
    from transformer_jax.data.pipeline import RunData


class OnMesh:
    """A jitted program traced with its mesh as JAX's context mesh (`jax.set_mesh`): the model's attention
    reads the platform and the devices to place its kernel on from it (model/attention_kernels.py)."""

    def __init__(self, jitted: Any, mesh: Mesh) -> None:
        self.jitted, self.mesh = jitted, mesh

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with jax.set_mesh(self.mesh):
            return self.jitted(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """The program lowered for these (possibly abstract) arguments."""
        with jax.set_mesh(self.mesh):
            return self.jitted.lower(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The shapes and dtypes of the program's outputs."""
        with jax.set_mesh(self.mesh):
            return jax.eval_shape(self.jitted, *args, **kwargs)


@dataclasses.dataclass(frozen=True)
class RunPrograms:
    """One run's model, state layout and jitted programs on its mesh, and the batch shapes they take."""

    config: ml_collections.ConfigDict
    model_config: TransformerConfig
    model: Transformer
    mesh: Mesh
    shapes: BatchShapes | None
    schedule: Callable[[jax.Array], jax.Array]
    create_state: Callable[[], TrainState]
    create_host_state: Callable[[], TrainState]  # create_state's values, traceable for the host's CPU
    shardings: Any  # NamedShardings of every leaf of the TrainState
    abstract_state: Any  # the TrainState as ShapeDtypeStructs carrying their shardings
    train_step: Callable  # (state, batch) -> (state, metrics); donates the state
    micro_gradients: Callable  # (state, batch, micro_step) -> (grad sums, metric sums)
    apply_gradients: Callable  # (state, grad sums, metric sums) -> (state, metrics); donates the state
    add_trees: Callable  # (a, b) -> a + b; donates a
    dev_loss_step: Callable  # (params, packed batch split over the batch axes) -> metric sums per row

    def _require_shapes(self) -> None:
        if self.shapes is None:
            raise ValueError("this run was built without batch shapes (build_run(..., shapes=None)); "
                             "pass the corpus's BatchShapes to lower its programs")

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer update."""
        return self.config.training.accumulation_steps

    def check_state_fits(self) -> None:
        """Raise ConfigError when the train state's shards do not fit the devices (before any is allocated)."""
        check_fits(state_bytes_per_device(self.abstract_state), self.mesh, train_state_description(self.model_config),
                   STATE_FIX)

    def init_state(self, on_host: bool | None = None) -> TrainState:
        """The initial state (checked to fit the devices first).

        On accelerators (`on_host` None), or with `on_host`, the host's CPU backend makes it whole and each process
        places its devices' shards (`place_whole`): the accelerator compiles nothing. The random initialisation is
        a large program (every parameter derives its key and draws its bits: ~30k instructions, 25 s to compile on
        an H200, ~7 s for a CPU), and threefry's bits are the same on every platform. On a CPU mesh, or where JAX
        has no CPU backend, one program on the mesh makes it, each device materializing only its own shards.
        """
        self.check_state_fits()
        host = host_cpu_device()
        if on_host is None:
            on_host = mesh_platform(self.mesh) != "cpu"
        if not on_host or host is None:
            return jax.jit(self.create_state, out_shardings=self.shardings)()
        whole = jax.jit(self.create_host_state, out_shardings=SingleDeviceSharding(host))()
        with jax.transfer_guard("allow"):  # the intended copy, wherever the state is first asked for
            return place_whole(whole, self.shardings)

    def compile_train(self, state: Any = None, micro_step: Any = None) -> list[jax.stages.Compiled]:
        """lower_train's programs compiled, each checked by XLA's memory analysis to fit a device."""
        compiled = []
        for name, lowered in self.lower_train(state, micro_step):
            program = lowered.compile()
            check_fits(compiled_bytes_per_device(program), self.mesh, f"the {name} (rows x tokens)",
                       f"lower data.tokens_per_batch (now {self.config.data.tokens_per_batch}), or reach the same "
                       "batch with --config.training.accumulation_steps, or shard over more devices")
            compiled.append(program)
        return compiled

    def micro_steps(self) -> list[jax.Array]:
        """The micro-step indices, placed on the devices once (the update then passes no Python scalars)."""
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return [jax.device_put(np.int32(i), replicated) for i in range(self.accumulation_steps)]

    def abstract_batch(self, rows: int, width: int, keys: tuple[str, ...]) -> dict[str, jax.ShapeDtypeStruct]:
        """A global batch of int32 [rows, width] arrays `keys`, split over the mesh's batch axes."""
        sharding = batch_sharding(self.mesh)
        return {key: jax.ShapeDtypeStruct((rows, width), np.int32, sharding=sharding) for key in keys}

    def lower_train(self, state: Any = None, micro_step: Any = None) -> list[tuple[str, jax.stages.Lowered]]:
        """The update lowered for every training batch shape: the train step, or with accumulation the
        micro-step's gradients for every shape and the update that applies their sums.

        `state` and `micro_step` default to their abstract forms (compile-only devices); the Trainer passes
        its own, so the executables it compiles are the ones its first steps find in jit's cache.
        """
        self._require_shapes()
        state = self.abstract_state if state is None else state
        lowered = []
        micro = micro_step if micro_step is not None else jax.ShapeDtypeStruct(
            (), np.int32, sharding=NamedSharding(self.mesh, PartitionSpec()))
        for rows, width in self.shapes.train:
            batch = self.abstract_batch(rows, width, self.shapes.train_keys)
            if self.accumulation_steps == 1:
                lowered.append((f"train step {rows}x{width}", self.train_step.lower(state, batch)))
            else:
                lowered.append((f"micro-step gradients {rows}x{width}",
                                self.micro_gradients.lower(state, batch, micro)))
        if self.accumulation_steps > 1:
            rows, width = self.shapes.train[0]
            sums = self.micro_gradients.eval_shape(state, self.abstract_batch(rows, width, self.shapes.train_keys),
                                                   micro)
            lowered.append(("apply accumulated gradients", self.apply_gradients.lower(state, *sums)))
        return lowered

    def lower_dev_loss(self) -> list[tuple[str, jax.stages.Lowered]]:
        """The dev-loss step lowered for every dev-loss batch shape (packed rows, as evaluate_loss reads them)."""
        self._require_shapes()
        return [(f"dev loss {rows}x{width}",
                 self.dev_loss_step.lower(self.abstract_state.params, self.abstract_batch(rows, width, PACKED_KEYS)))
                for rows, width in self.shapes.dev_loss]

    def search(self, options: DecodeOptions, dtype: str = "", mesh: Mesh | None = None) -> tuple[Callable,
                                                                                              TransformerConfig]:
        """The search of a batch split over `mesh` (default: the run's), `(params, src, rng) -> ids`, and the config
        it runs.

        Its parameters are the run's, replicated and cast by `decoding_precision` (with the returned
        config) for the mesh's platform: the precision is chosen here, once for the program.
        """
        mesh = self.mesh if mesh is None else mesh
        _, config = decoding_precision({}, self.model_config, dtype, mesh_platform(mesh))
        return functools.partial(translate_rows, config=config, options=options, mesh=mesh), config

    def search_shape(self, width: int | None = None, batching: TranslationBatching | None = None,
                     mesh: Mesh | None = None) -> tuple[int, int]:
        """(rows, source width) of a translation batch: the widest of the run's splits, or sources of `width` tokens
        in the rows `batching` (default: the run's translation batching) gives that width on `mesh` (default: the
        run's)."""
        if width is None:
            self._require_shapes()
            return self.shapes.translation
        batching = translation_batching(self.config) if batching is None else batching
        devices = (self.mesh if mesh is None else mesh).size
        return translation_rows(width, batching.batch_size, batching.batch_tokens, devices), width

    def lower_search(self, options: DecodeOptions, dtype: str = "", width: int | None = None, *,
                     batching: TranslationBatching | None = None,
                     mesh: Mesh | None = None) -> tuple[str, jax.stages.Lowered]:
        """The search lowered for a translation batch (`search_shape(width, batching, mesh)`), by default the widest,
        split over `mesh` (default: the run's; `translate-corpus` splits each batch over one process's devices)."""
        mesh = self.mesh if mesh is None else mesh
        search, _ = self.search(options, dtype, mesh)
        platform = mesh_platform(mesh)
        replicated = NamedSharding(mesh, PartitionSpec())
        params = jax.eval_shape(lambda p: decoding_precision(p, self.model_config, dtype, platform)[0],
                                nn.meta.unbox(self.abstract_state.params))
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), params)
        rows, width = self.search_shape(width, batching, mesh)
        src = jax.ShapeDtypeStruct((rows, width), np.int32, sharding=batch_sharding(mesh))
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
        row_ids = jax.ShapeDtypeStruct((rows,), np.uint32, sharding=batch_sharding(mesh))  # as translate_encoded's
        return f"{options.describe()} {rows}x{width}", search.func.lower(params, src, key, row_ids_B=row_ids,
                                                                         **search.keywords)


STATE_FIX = "lower the model's sizes, or shard the state over more devices with --config.mesh.fsdp"


def train_state_description(model: TransformerConfig) -> str:
    """What the train state of `model` is, for a message saying it does not fit."""
    return (f"the train state (parameters and Adam moments of d_model={model.d_model}, d_ff={model.d_ff}, "
            f"{model.num_layers} layers, a vocabulary of {model.vocab_size})")


# The runs built in this process, newest last: a run built again with the same settings on the same mesh (a
# Trainer made again in one Python process: a retry after a fault, a notebook's rerun, a resume) gets the same
# jitted programs, which JAX has traced, lowered and compiled already (a fresh build traces and lowers them anew:
# about 2.7 s of CPU for the smoke run, far more for a real model). A few are kept; each holds only programs.
_BUILT: dict[tuple, RunPrograms] = {}
_KEEP_BUILT = 4


def build_run(config: ml_collections.ConfigDict, mesh: Mesh, vocab_size: int,
              shapes: BatchShapes | None = None) -> RunPrograms:
    """Build the run `config` describes on `mesh`, for a vocabulary of `vocab_size` and batches of `shapes`
    (None: nothing to lower ahead of time, e.g. eval.py, whose shapes come from the split it reads).

    The same settings on the same mesh in one process give the same programs (a copy holding this `config`)."""
    key = (config.to_json_best_effort(sort_keys=True), mesh, vocab_size, shapes)
    if key in _BUILT:
        _BUILT[key] = _BUILT.pop(key)  # the newest again
        return dataclasses.replace(_BUILT[key], config=config)
    programs = _build_run(config, mesh, vocab_size, shapes)
    _BUILT[key] = programs
    while len(_BUILT) > _KEEP_BUILT:
        del _BUILT[next(iter(_BUILT))]
    return programs


def _build_run(config: ml_collections.ConfigDict, mesh: Mesh, vocab_size: int,
               shapes: BatchShapes | None) -> RunPrograms:
    model_config = run_model_config(config, vocab_size)
    if model_config.attention_backend == "cudnn" and mesh_platform(mesh) != "gpu":
        raise ConfigError(f"model.attention_backend='cudnn' needs NVIDIA GPUs, but this run's devices are "
                          f"{mesh_platform(mesh)}; set --config.model.attention_backend=fused (cuDNN on GPUs, "
                          "XLA's attention elsewhere) or einsum")
    model = Transformer(model_config)
    training = config.training
    scale = (peak_scale(model_config.d_model, training.warmup_steps, training.peak_learning_rate)
             if training.peak_learning_rate else training.learning_rate_scale)
    schedule = paper_learning_rate(model_config.d_model, training.warmup_steps, scale)
    optimizer = paper_optimizer(schedule, training.adam_b1, training.adam_b2, training.adam_eps,
                                training.grad_clip_norm or None)

    def create_state() -> TrainState:
        return create_train_state(model, optimizer, training.seed)

    # model.init traces a forward pass: on the host's CPU, with attention the CPU runs (the run's backend may be a
    # GPU's or a TPU's kernel). The parameters do not depend on the attention backend; the state keeps the run's
    # model.apply, so its tree is the run's.
    host_model = Transformer(model_config.replace(attention_backend="einsum"))

    def create_host_state() -> TrainState:
        return create_train_state(host_model, optimizer, training.seed).replace(apply_fn=model.apply)

    # Before the model is traced (a layer count or width too large for any device would take minutes to build):
    # the parameters and Adam's two moments, in the parameters' dtype, by the closed form, sharded over fsdp.
    state_estimate = 3 * parameter_count(model_config) * np.dtype(model_config.params_dtype).itemsize
    check_fits(state_estimate // mesh.shape["fsdp"], mesh, train_state_description(model_config), STATE_FIX)
    shardings = state_shardings(mesh, jax.eval_shape(create_state))
    batch = batch_sharding(mesh)
    smoothing = training.label_smoothing
    projected = projected_loss_for(training.loss_chunk_tokens, model_config, mesh, training.loss_kernel)
    skip_by, norm_by = skip_by_for(mesh_platform(mesh)), norm_by_for(mesh_platform(mesh))

    def micro_gradients(state: TrainState, b: dict[str, jax.Array], micro_step: jax.Array) -> tuple[Any, Any]:
        return compute_gradients(state, b, smoothing, micro_step, projected)

    return RunPrograms(
        config=config, model_config=model_config, model=model, mesh=mesh, shapes=shapes, schedule=schedule,
        create_state=create_state, create_host_state=create_host_state, shardings=shardings,
        abstract_state=abstract_with_shardings(jax.eval_shape(create_state), shardings),
        train_step=OnMesh(jax.jit(  # a partial, not a lambda: compile logs and events name it train_step
            functools.partial(train_step, smoothing=smoothing, projected=projected, skip_by=skip_by, norm_by=norm_by),
            in_shardings=(shardings, batch), out_shardings=(shardings, None), donate_argnums=0), mesh),
        micro_gradients=OnMesh(jax.jit(micro_gradients, in_shardings=(shardings, batch, None),
                                       out_shardings=(shardings.params, None)), mesh),
        apply_gradients=jax.jit(functools.partial(apply_gradients, skip_by=skip_by, norm_by=norm_by),
                                in_shardings=(shardings, shardings.params, None),
                                out_shardings=(shardings, None), donate_argnums=0),
        add_trees=jax.jit(add_trees, donate_argnums=0),
        dev_loss_step=dev_loss_step(model_config, smoothing, mesh),
    )


def build_run_for(config: ml_collections.ConfigDict, mesh: Mesh, data: RunData | None = None) -> RunPrograms:
    """The run on `mesh` for the batch shapes `data`'s corpus gives (train.py, the preflight with a workdir),
    or, without data, for rows of data.max_length and a vocabulary of data.vocab_size (the preflight alone)."""
    vocab_size = data.tokenizer.vocab_size if data else config.model.vocab_size or config.data.vocab_size
    max_len, batching = run_model_config(config, vocab_size).max_len, translation_batching(config)
    if data:
        shapes = data.batch_shapes(config.data.eval_batch_size, batching, max_len, mesh.size)
    else:
        shapes = nominal_batch_shapes(config.data.tokens_per_batch, config.data.max_length, config.data.pack,
                                      config.data.eval_batch_size, batching, max_len, mesh.size)
    return build_run(config, mesh, vocab_size, shapes)
