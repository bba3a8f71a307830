"""The settings govern: `training.checkpoint_every` alone decides a run's checkpoints (an evaluation between them
saves none; one at a checkpoint's step goes with it), and a resume with a setting its checkpoints cannot be restored
with is refused in one line naming the setting, before anything is written. Each through train.py, on a copy of
the suite's trained tiny run (configs/smoke.py: checkpoints every 2 steps, 2 kept, dev loss every 3; steps 4 and 6
kept)."""

import json

from runs import NO_TEST_TRANSLATION, assert_one_line_error, copy_run, run_rows, run_script, snapshot
from transformer_jax.base.log_records import read_metrics
from transformer_jax.checkpoints import Checkpointer


def saved_steps(workdir):
    return sorted(int(path.name) for path in (workdir / "checkpoints").iterdir() if path.name.isdigit())


def test_checkpoint_every_alone_decides_the_checkpoints_and_an_evaluation_at_one_goes_with_it(script_trained_run,
                                                                                            tmp_path):
    """Evaluated at every step, checkpointed every 100: two evaluations, one checkpoint (the end's), as config.json
    says; the end's checkpoint carries the metrics logged at its step, which rank it for --checkpoint=best."""
    workdir = copy_run(script_trained_run, tmp_path / "run")
    assert saved_steps(workdir) == [4, 6]  # the trained run: every 2 steps, not at the evaluation of step 3
    result = run_script("train.py", f"--config={script_trained_run['config']}", f"--workdir={workdir}",
                        "--config.training.num_train_steps=8", "--config.training.eval_every=1",
                        "--config.training.checkpoint_every=100", "--config.training.keep_checkpoints=5",
                        NO_TEST_TRANSLATION)
    assert result.returncode == 0, result.stderr[-3000:]
    dev = {record["step"]: record for record in read_metrics(str(workdir)) if record["split"] == "dev"}
    assert sorted(dev) == [3, 6, 7, 8]
    assert saved_steps(workdir) == [4, 6, 8]
    assert json.loads((workdir / "config.json").read_text())["training"]["checkpoint_every"] == 100
    checkpointer = Checkpointer(str(workdir / "checkpoints"), best_metric="dev_loss", best_mode="min", read_only=True)
    assert checkpointer.meta(8)["metrics"]["dev_loss"] == dev[8]["loss"]
    assert checkpointer.best_step() in (6, 8) and checkpointer.meta(4)["metrics"] == {}


def test_a_resume_its_checkpoints_cannot_be_restored_with_is_refused_naming_the_setting(script_trained_run, tmp_path):
    """Clipping turned on (the optimizer's state gains a step), another parameter dtype (restored, its arrays would be
    cast and fail their checksums: once blamed on damage), other shapes: each refused before anything is written."""
    workdir = copy_run(script_trained_run, tmp_path / "run")
    before = snapshot(workdir)
    common = [f"--config={script_trained_run['config']}", f"--workdir={workdir}", "--config.training.num_train_steps=8"]
    rows = [
        (["--config.training.grad_clip_norm=1"],
         ["training.grad_clip_norm 0.0 -> 1.0 would change the optimizer state that the checkpoints in "
          f"{workdir} hold (turning clipping on or off", "pass --config.training.grad_clip_norm=0.0 to resume",
          "or start a new run in another --workdir"]),
        (["--config.model.param_dtype=bfloat16"],
         ['model.param_dtype "float32" -> "bfloat16" would change the parameters',
          "pass --config.model.param_dtype=float32 to resume"]),
        (["--config.model.d_ff=128", "--config.model.scan_layers=True"],
         ["model.d_ff 64 -> 128, model.scan_layers false -> true would change the parameters",
          "cannot resume with them; pass --config.model.d_ff=64 --config.model.scan_layers=False to resume"]),
    ]
    results = run_rows("train.py", [common + flags for flags, _ in rows], tmp_path)
    for (_, fragments), result in zip(rows, results):
        line = assert_one_line_error(result, *fragments)
        assert "checksum" not in line and "does not match" not in line
    assert snapshot(workdir) == before
