"""The run builder: train.py's Trainer and the preflight (transformer_jax.aot) compile the same programs."""

import contextlib
from typing import Iterator

import jax
import numpy as np

from transformer_jax.aot.compile import compile_run, run_programs
from transformer_jax.base import make_mesh
from transformer_jax.data.shapes import PACKED_KEYS, nominal_batch_shapes
from transformer_jax.model import Transformer
from transformer_jax.training.dev_loss import loss_batches
from transformer_jax.run import Trainer, assemble_run, build_run


def hlo_by_name(lowered):
    return {name: program.as_text() for name, program in lowered}


def test_the_preflight_compiles_the_programs_train_py_runs_for_the_same_corpus(run_config, tmp_path):
    run_config.data.max_length = 64  # the corpus's pairs are far shorter: its rows are not rows of max_length
    run_config.data.row_width = 0  # widths chosen from the corpus (the tiny run's rows are max_length wide)
    run_config.model.max_len = 65
    trainer = Trainer(assemble_run(run_config, str(tmp_path)))
    compiled_shapes = trainer.compile_steps()
    trained = hlo_by_name(trainer.programs.lower_train(trainer.state, trainer.micro_steps[0]))
    # What Trainer.dev_loss feeds the dev-loss step.
    dev_loss_shapes = {batch["inputs"].shape for batch in loss_batches(
        trainer.data.dev.encoded, run_config.data.eval_batch_size, trainer.data.train.row_width, trainer.mesh.size)}
    trainer.close()

    preflight = run_programs(run_config, make_mesh(run_config.mesh.data, run_config.mesh.fsdp), str(tmp_path))
    assert preflight.shapes == trainer.programs.shapes and preflight.shapes.origin == "the corpus"
    assert list(preflight.shapes.train) == compiled_shapes == trainer.data.train.batch_shapes()
    assert set(preflight.shapes.dev_loss) == dev_loss_shapes
    assert min(width for _, width in preflight.shapes.train) < run_config.data.max_length
    # The same programs: the same input shapes and shardings give the same lowered module.
    assert hlo_by_name(preflight.lower_train()) == trained
    assert all(name.startswith("train step ") for name in trained)

    # Without a corpus the preflight says so, and compiles rows of data.max_length.
    nominal = run_programs(run_config, make_mesh(run_config.mesh.data, run_config.mesh.fsdp)).shapes
    assert nominal.train == ((run_config.data.tokens_per_batch // 64, 64),) and "max_length" in nominal.origin
    assert nominal.train_keys == PACKED_KEYS


def test_the_preflight_on_cpu_devices_reports_each_program_it_compiles(run_config):
    run_config.training.accumulation_steps = 2
    shapes, programs = compile_run(run_config, make_mesh(devices=jax.devices()[:1]))
    names = [program.name for program in programs]
    rows, width = shapes.rows, shapes.width
    assert names[:2] == [f"micro-step gradients {rows}x{width}", "apply accumulated gradients"]
    assert any(name.startswith("dev loss ") for name in names) and names[-1].startswith("beam search (beam")
    assert all(program.flops > 0 and program.total_bytes > 0 for program in programs)


@contextlib.contextmanager
def functions_of(event: str) -> Iterator[list[str]]:
    """The names of the functions JAX reports `event` for (a duration event: compiling, tracing) inside the block."""
    names: list[str] = []

    def listen(reported: str, duration: float, fun_name: str = "", **_) -> None:
        if reported == event:
            names.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_the_hosts_initial_state_is_the_meshs_bit_for_bit_and_its_placement_compiles_nothing(run_config):
    # On accelerators init_state makes the state with the host's CPU and places it (no accelerator program).
    programs = build_run(run_config, make_mesh(devices=jax.devices()[:1]), 64)
    on_mesh = programs.init_state(on_host=False)
    with functions_of("/jax/core/compile/backend_compile_duration") as compiled:
        placed = programs.init_state(on_host=True)
    assert set(compiled) <= {"jit(create_host_state)"}  # (none when the compile cache had it)
    assert jax.tree.structure(placed) == jax.tree.structure(on_mesh)
    for got, want in zip(jax.tree.leaves(placed), jax.tree.leaves(on_mesh), strict=True):
        assert got.dtype == want.dtype and got.sharding == want.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert placed.params is not on_mesh.params and jax.tree.leaves(placed.opt_state)


def test_the_parameters_do_not_depend_on_the_attention_backend(tiny_config):
    # The host traces model.init with einsum attention (a GPU's or TPU's kernel may not run on its CPU).
    tokens = jax.numpy.ones((1, 8), np.int32)

    def layout(backend):
        model = Transformer(tiny_config.replace(attention_backend=backend, attention_dropout_rate=0.0))
        return jax.tree.map(lambda x: (x.shape, x.dtype), jax.eval_shape(model.init, jax.random.key(0), tokens, tokens))

    assert layout("fused") == layout("splash") == layout("auto") == layout("einsum")


def test_nominal_shapes_round_rows_to_the_mesh():
    from transformer_jax.data.shapes import TranslationBatching

    shapes = nominal_batch_shapes(4096, 128, True, 10, TranslationBatching(10), 256, row_multiple=4)
    assert shapes.train == ((32, 128),) and shapes.dev_loss == ((12, 128),)
    assert shapes.translation == (8, 256)  # 10 rows rounded down to the 4 devices, at the widest width
    assert np.prod(shapes.train[0]) <= 4096


def test_a_run_built_again_in_one_process_reuses_its_traced_programs(run_config):
    # A Trainer made again in one process (a retry, a notebook's rerun) traces and lowers nothing again; a setting
    # changed gives programs of their own.
    mesh = make_mesh(devices=jax.devices()[:1])
    first = run_programs(run_config, mesh)
    first.lower_train()
    with functions_of("/jax/core/compile/jaxpr_trace_duration") as traced:
        again = run_programs(run_config.copy_and_resolve_references(), mesh)
        again.lower_train()
        assert traced == [] and again.train_step is first.train_step
        run_config.training.label_smoothing = 0.2
        other = run_programs(run_config, mesh)
        other.lower_train()
    assert other.train_step is not first.train_step and other.config is run_config
    assert any("train_step" in name for name in traced)
