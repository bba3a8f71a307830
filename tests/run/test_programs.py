"""The run builder: train.py's Trainer and the preflight (transformer_jax.aot) compile the same programs."""

import jax
import numpy as np

from transformer_jax.aot.compile import compile_run, run_programs
from transformer_jax.base import make_mesh
from transformer_jax.data.shapes import PACKED_KEYS, nominal_batch_shapes
from transformer_jax.run.dev_loss import loss_batches
from transformer_jax.run import Trainer, assemble_run


def hlo_by_name(lowered):
    return {name: program.as_text() for name, program in lowered}


def test_the_preflight_compiles_the_programs_train_py_runs_for_the_same_corpus(run_config, tmp_path):
    run_config.data.max_length = 64  # the corpus's pairs are far shorter: its rows are not rows of max_length
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


def test_nominal_shapes_round_rows_to_the_mesh():
    from transformer_jax.data.shapes import TranslationBatching

    shapes = nominal_batch_shapes(4096, 128, True, 10, TranslationBatching(10), 256, row_multiple=4)
    assert shapes.train == ((32, 128),) and shapes.dev_loss == ((12, 128),)
    assert shapes.translation == (8, 256)  # 10 rows rounded down to the 4 devices, at the widest width
    assert np.prod(shapes.train[0]) <= 4096
