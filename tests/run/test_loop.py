"""The training loop: metrics, checkpoints, resume equal to an uninterrupted run, the non-finite guard."""

import datetime
import json
import os

import jax
import numpy as np
import pytest

from runs import copy_run
from transformer_jax.data.pipeline import prepare_data
from transformer_jax.errors import ConfigError, TrainingError
from transformer_jax.config.schema import model_config
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.run import Trainer, assemble_run, loop
from transformer_jax.base.log_records import read_metrics


def train_losses(workdir):
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if r["split"] == "train"}


def params_of(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]


def test_run_logs_checkpoints_and_keeps_the_last_k(trained_run, tmp_path):
    """What a fresh tiny run (trained_run: these tests' run_config, trained in-process with Trainer) wrote."""
    workdir = copy_run(trained_run, tmp_path / "run")  # its own: the Checkpointer below opens it as a writer
    assert Checkpointer(str(workdir / "checkpoints"), read_only=True).latest_step() == 6
    records = read_metrics(str(workdir))
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss"]) for r in train)
    assert {"loss", "nll", "perplexity", "accuracy", "learning_rate", "grad_norm"} <= set(train[0])
    # Wall-clock throughput stays out of metrics.jsonl (not reproducible) and goes to timing.jsonl.
    assert not any("tokens_per_second" in r for r in records)
    timing = [json.loads(line) for line in (workdir / "timing.jsonl").read_text().splitlines()]
    windows = [t for t in timing if "tokens_per_second" in t]
    assert [t["step"] for t in windows] == [1, 2, 3, 4, 5, 6] and all(t["tokens_per_second"] > 0 for t in windows)
    for t in windows:  # where the host spent each window: its parts fit in the window, the share is a fraction
        window_seconds = t["seconds_per_step"]  # one step per window here
        assert 0 <= t["input_seconds"] and 0 < t["dispatch_seconds"] and 0 <= t["sync_seconds"]
        assert 0 <= t["lead_wait_seconds"]  # the wait that keeps the host at most 2 updates ahead
        parts = t["input_seconds"] + t["dispatch_seconds"] + t["sync_seconds"] + t["lead_wait_seconds"]
        assert parts <= window_seconds * 1.01 + 1e-3
        idle = t["sync_seconds"] + t["lead_wait_seconds"]
        assert t["host_share"] == pytest.approx(max(0.0, 1 - idle / window_seconds), abs=1e-6)
    # The start-up record (step 0) comes first: its parts (restoring, compiling) within the whole start-up.
    start = timing[0]
    assert start["step"] == 0 and "tokens_per_second" not in start
    assert 0 <= start["restore_seconds"] and 0 < start["compile_seconds"] < start["startup_seconds"]
    # Each checkpoint written stalled the loop for a measured time; each dev evaluation is timed too.
    # training.checkpoint_every=2 alone decides the checkpoints: not the evaluation of step 3 (eval_every=3).
    stalls = [t["step"] for t in timing if "checkpoint_stall_seconds" in t]
    assert stalls == [2, 4, 6]
    assert all(t["checkpoint_stall_seconds"] > 0 for t in timing if "checkpoint_stall_seconds" in t)
    assert [t["step"] for t in timing if "eval_seconds" in t] == [3, 6]
    dev = [r for r in records if r["split"] == "dev"]
    assert [r["step"] for r in dev] == [3, 6]
    np.testing.assert_allclose(dev[0]["perplexity"], np.exp(dev[0]["nll"]), rtol=1e-5)
    # Keep the last 2 (4, 6) plus the best by dev loss among the checkpoints saved with an evaluation: 6's metrics
    # are those logged at step 6; step 3's evaluation, between checkpoints, ranks none.
    checkpointer = Checkpointer(str(workdir / "checkpoints"), best_metric="dev_loss", best_mode="min")
    assert checkpointer.steps() == [4, 6] and checkpointer.best_step() == 6
    assert checkpointer.meta(6)["metrics"] == {f"dev_{k}": v for k, v in dev[1].items() if k not in ("step", "split")}
    assert checkpointer.meta(4)["metrics"] == {}
    assert os.listdir(workdir / "tensorboard")
    assert json.load(open(workdir / "config.json"))["model"]["d_model"] == 32


def test_a_stop_that_cannot_fit_its_grace_period_is_said_once_with_the_measured_figures(run_config, tmp_path, capfd):
    """The first save of a start is waited for and timed; with the first window's seconds per update, the stop's
    estimate goes to timing.jsonl, and a budget it exceeds gets one line naming the setting to change."""
    run_config.training.stop_grace_seconds = 1e-4
    Trainer(assemble_run(run_config, str(tmp_path))).run()
    lines = [line for line in capfd.readouterr().out.splitlines() if "may not fit its grace period" in line]
    assert len(lines) == 1 and "training.stop_grace_seconds=0.0001" in lines[0], lines
    assert "lower --config.training.max_updates_in_flight" in lines[0]
    timing = [json.loads(line) for line in (tmp_path / "timing.jsonl").read_text().splitlines()]
    (write,) = [t for t in timing if "checkpoint_write_seconds" in t]  # the first save only (step 2 of the tiny run)
    (estimate,) = [t for t in timing if "stop_estimate_seconds" in t]
    (window,) = [t for t in timing if "seconds_per_step" in t and t["step"] == 2]  # the last closed before
    assert write["step"] == 2 and estimate["step"] == 2
    assert estimate["stop_estimate_seconds"] == pytest.approx(
        2 * window["seconds_per_step"] + write["checkpoint_write_seconds"])
    # At the default budget (30 s) a tiny run's stop fits and nothing is said: the resumed start of
    # test_resume_continues_exactly_like_an_uninterrupted_run checks that.


def test_resume_continues_exactly_like_an_uninterrupted_run(run_config, trained_run, tmp_path, capfd):
    uninterrupted = trained_run["workdir"]  # run_config's 6 steps, never stopped (trained in-process with Trainer)

    first = run_config.copy_and_resolve_references()
    first.training.num_train_steps = 3  # stops at step 3 (checkpointed), as a preempted run would
    Trainer(assemble_run(first, str(tmp_path / "b"))).run()
    resumed = Trainer(assemble_run(run_config, str(tmp_path / "b")))
    # A resumed run's state is the checkpoint's: the initial state's program is neither compiled nor run.
    object.__setattr__(resumed.programs, "init_state", lambda: pytest.fail("the resumed run made an initial state"))
    capfd.readouterr()
    resumed.run()
    # The resumed start's first save (step 4) is timed too: at the default training.stop_grace_seconds (30 s) a tiny
    # run's stop fits, and nothing is said about it.
    assert "grace period" not in capfd.readouterr().out
    timing = [json.loads(line) for line in (tmp_path / "b" / "timing.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timing if "stop_estimate_seconds" in t] == [2, 4]  # each start's stop was estimated

    assert train_losses(str(tmp_path / "b")) == train_losses(str(uninterrupted))
    assert not (tmp_path / "b" / "config_changes.jsonl").exists()  # going further changes no earlier step
    # The uninterrupted run's parameters at step 6, as its checkpoint holds them, against the resumed run's.
    final = Checkpointer(str(uninterrupted / "checkpoints"), read_only=True).restore_params(6)
    for a, b in zip([np.asarray(x) for x in jax.tree.leaves(final)], params_of(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_non_finite_updates_stop_training_and_keep_the_last_good_checkpoint(run_config, trained_run, tmp_path,
                                                                           monkeypatch):
    workdir = copy_run(trained_run, tmp_path / "run")  # run_config's 6 steps: a good checkpoint at step 6
    said = []
    monkeypatch.setattr(loop, "say", said.append)
    config = run_config.copy_and_resolve_references()
    config.training.num_train_steps = 12
    config.training.learning_rate_scale = 1e30  # the first update overflows to inf
    config.training.max_skipped_updates = 2
    trainer = Trainer(assemble_run(config, str(workdir)))
    with pytest.raises(TrainingError, match="non-finite"):
        trainer.run()
    # The resume changed what a step means (the learning rate): dated in the change log, said once; config.json
    # holds the settings the run went on with. How far it goes and its patience are not such changes.
    changes = [json.loads(line) for line in (workdir / "config_changes.jsonl").read_text().splitlines()]
    assert [(c["step"], c["changes"]) for c in changes] == [(6, {"training.learning_rate_scale": [1.0, 1e30]})]
    assert changes[0]["time"].startswith(str(datetime.datetime.now(datetime.timezone.utc).year))
    assert [line for line in said if "with changed settings" in line] == [
        f"resuming at step 6 with changed settings, recorded in {workdir}/config_changes.jsonl: "
        "training.learning_rate_scale 1.0 -> 1e+30"]
    assert json.load(open(workdir / "config.json"))["training"]["learning_rate_scale"] == 1e30
    checkpointer = Checkpointer(str(workdir / "checkpoints"))
    for step in checkpointer.steps():
        params = checkpointer.restore_params(step)
        assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params)), step


def test_vocab_size_must_agree_with_the_tokenizer(run_config):
    run_config.model.vocab_size = 123
    with pytest.raises(ConfigError, match="disagrees with the tokenizer's 500"):
        model_config(run_config, 500)


def test_preempted_run_resumes_with_the_same_log_as_an_uninterrupted_one(run_config, tmp_path):
    """SIGTERM mid log-window: the resumed run's metrics.jsonl and parameters equal an uninterrupted run's."""
    import signal

    run_config.training.update(num_train_steps=8, log_every=4, eval_every=0, checkpoint_every=100)
    uninterrupted = Trainer(assemble_run(run_config, str(tmp_path / "a")))
    uninterrupted.run()

    preempted = Trainer(assemble_run(run_config, str(tmp_path / "b")))
    update, calls = preempted.update, []

    def update_then_signal():
        calls.append(1)
        if len(calls) == 3:  # a real SIGTERM arrives during step 3, inside the first log window
            signal.raise_signal(signal.SIGTERM)
        return update()

    preempted.update = update_then_signal
    assert int(preempted.run().step) == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is given back
    resumed = Trainer(assemble_run(run_config, str(tmp_path / "b")))
    resumed.run()

    assert (tmp_path / "b" / "metrics.jsonl").read_bytes() == (tmp_path / "a" / "metrics.jsonl").read_bytes()
    assert [r["step"] for r in read_metrics(str(tmp_path / "b"))] == [4, 8]
    for a, b in zip(params_of(uninterrupted), params_of(resumed)):
        np.testing.assert_array_equal(a, b)


def test_an_unfinished_save_is_never_taken_for_the_latest_checkpoint(run_config, trained_run, tmp_path):
    """Orbax writes into a temporary directory and renames it when complete: a crash mid-save leaves
    only that temporary directory, which readers ignore and the next training run removes."""
    workdir = copy_run(trained_run, tmp_path / "run")  # run_config's 6 steps
    unfinished = workdir / "checkpoints" / "8.orbax-checkpoint-tmp-1795270000000000"
    (unfinished / "state").mkdir(parents=True)
    (unfinished / "state" / "partial").write_bytes(b"\0" * 100)
    assert Checkpointer(str(workdir / "checkpoints"), read_only=True).latest_step() == 6
    assert unfinished.exists()  # a reader (eval.py) leaves a save in progress alone
    config = run_config.copy_and_resolve_references()
    config.training.num_train_steps = 8
    resumed = Trainer(assemble_run(config, str(workdir)))
    assert resumed.restore_latest()[0] == 6
    resumed.close()
    assert not unfinished.exists()  # the writer cleans it up


def test_training_steps_make_no_implicit_host_device_transfers(run_config, tmp_path):
    """update() runs under jax.transfer_guard("disallow"): only the batches' explicit copy crosses."""
    run_config.training.accumulation_steps = 2  # the accumulation path; the other tests cover the plain one
    trainer = Trainer(assemble_run(run_config, str(tmp_path)))
    for _ in range(2):
        metrics = trainer.update()
    assert int(jax.device_get(trainer.state.step)) == 2 and np.isfinite(jax.device_get(metrics["loss"]))
    # Python ints, as update() once passed them: an implicit transfer
    trainer.micro_steps = [0, 1]
    with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
        trainer.update()
    trainer.close()


@pytest.mark.parametrize("accumulation_steps, step_name", [(1, "jit(train_step)"), (2, "jit(micro_gradients)")])
def test_every_batch_shape_is_compiled_once_before_the_first_step(run_config, tmp_path, accumulation_steps,
                                                                  step_name):
    """Rows of 16 tokens and the longer pairs in rows of their own: two shapes, both compiled before step 1,
    though the run reads the second only steps in (a process compiling it then would hold the
    others up in the step's collectives), and neither again when its batches come."""
    run_config.data.row_width = 16
    # Training seed 4's epoch first has a 16-token batch as its sixth (seed 0's: its 36th), so the run is a few
    # steps long; the asserts below still require the second shape's first batch to come after step 2.
    run_config.training.seed = 4
    run_config.training.accumulation_steps = accumulation_steps
    data = prepare_data(run_config, str(tmp_path))
    widths = data.train.plan(0).batch_lengths.tolist()
    assert len(set(widths)) == 2 == len(data.train.batch_shapes())
    first_other = next(i for i, w in enumerate(widths) if w != widths[0])  # the batch that first has the other shape
    run_config.training.num_train_steps = first_other // accumulation_steps + 1
    events = []

    class Observed(Trainer):
        def update(self):
            events.append("step")
            return super().update()

    def listen(event: str, duration: float, fun_name: str = "", **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration" and fun_name == step_name:
            events.append("compile")

    trainer = Observed(assemble_run(run_config, str(tmp_path), data=data))
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        trainer.run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
        trainer.close()
    assert events == ["compile", "compile"] + ["step"] * run_config.training.num_train_steps
    assert run_config.training.num_train_steps > 2  # the second shape's first batch comes after step 2


def test_a_run_with_every_update_skipped_or_parameters_not_finite_is_not_scored():
    """What train.py checks before the test translation (check_trained, after the loop)."""
    from transformer_jax.run.failures import check_trained

    state = type("State", (), {"skipped_updates": np.int32(4), "consecutive_skipped": np.int32(4),
                               "params": {"w": np.ones(2)}})()
    with pytest.raises(TrainingError, match="all 4 updates had a non-finite loss or gradient"):
        check_trained(state, 4)
    state.skipped_updates = state.consecutive_skipped = np.int32(3)
    # The first update went through, the last three were skipped: the final state is not saved, nothing to score.
    with pytest.raises(TrainingError, match=r"the last 3 of 4 updates .* \(the last good checkpoint, step 2, is kept"):
        check_trained(state, 4, newest_checkpoint=lambda: 2)
    with pytest.raises(TrainingError, match=r"\(no checkpoint was written\)"):
        check_trained(state, 4)
    state.consecutive_skipped = np.int32(0)
    check_trained(state, 4)  # the last update went through: trained
    state.params = {"w": np.array([1.0, np.nan])}
    with pytest.raises(TrainingError, match="parameters at step 4 are not finite"):
        check_trained(state, 4)


def resumed_to_10():
    """tiny_run_config going on from the trained run's step 6 to step 10, stopped by 2 skipped updates in a row, no dev
    loss: the two tests below that replace its train step build the same run (one build in one process)."""
    from runs import tiny_run_config

    config = tiny_run_config()
    config.training.update(num_train_steps=10, max_skipped_updates=2, eval_every=0)
    return config


def with_train_step(trainer, step):
    """`trainer` with its train step replaced by `step(real_step, state, batch)`, jitted on its mesh."""
    import dataclasses
    import functools

    from transformer_jax.run.programs import OnMesh

    real = trainer.programs.train_step.jitted
    jitted = jax.jit(functools.partial(step, real), donate_argnums=0)
    trainer.programs = dataclasses.replace(trainer.programs, train_step=OnMesh(jitted, trainer.mesh))
    return trainer


def test_a_step_that_fails_on_the_device_is_one_line_naming_it_exit_3_and_the_checkpoints_stay(
        trained_run, tmp_path, capsys):
    """A real runtime error inside the compiled train step (a host callback that raises, at update 8)."""
    from runs import snapshot
    from transformer_jax.cli.user_errors import DEVICE_ERROR_EXIT, user_errors
    from transformer_jax.errors import DeviceError

    workdir = copy_run(trained_run, tmp_path / "run")  # checkpoints of steps 4 and 6
    before = snapshot(workdir / "checkpoints")
    config = resumed_to_10()  # no update is skipped here: it fails before its dev loss or patience matter

    def fault(step):
        if int(jax.device_get(step)) == 7:  # the state before update 8
            raise RuntimeError("the test's device fault")

    def failing(real, state, batch):
        jax.debug.callback(fault, state.step)
        return real(state, batch)

    trainer = with_train_step(Trainer(assemble_run(config, str(workdir))), failing)
    with pytest.raises(DeviceError) as failure:
        trainer.run()
    trainer.close()
    line = str(failure.value)
    for fragment in ("train_step (update 8) failed on the device (attention: einsum)", "the test's device fault",
                     "try --config.model.attention_backend=fused",
                     "the last good checkpoint, step 6, is kept; the same command resumes from it"):
        assert fragment in line, line
    assert "\n" not in line
    assert snapshot(workdir / "checkpoints") == before  # nothing deleted, nothing half written
    params = Checkpointer(str(workdir / "checkpoints"), read_only=True).restore_params(6)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params))
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped, user_errors():  # what the commands print and exit with
        raise failure.value
    assert stopped.value.code == DEVICE_ERROR_EXIT == 3
    assert capsys.readouterr().err.splitlines() == [f"error: {line}"]


def test_out_of_memory_and_a_failed_capture_name_their_own_remedy():
    from transformer_jax.run.failures import device_failure
    from runs import tiny_run_config

    config = tiny_run_config()
    oom = device_failure(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                                                    "1.20GiB."), "train_step (update 3)", "fused", config, None)
    assert str(oom) == (
        "train_step (update 3) ran out of device memory (attention: fused): RESOURCE_EXHAUSTED: Out of memory while "
        f"trying to allocate 1.20GiB.; lower --config.data.tokens_per_batch (it is {config.data.tokens_per_batch}) "
        "and reach the same batch with --config.training.accumulation_steps, or set --config.model.remat=dots (no "
        "checkpoint was written)")
    capture = device_failure(jax.errors.JaxRuntimeError(
        "INTERNAL: detail::cuda_graph_end_capture(fake_stream, &graph_obj) failed with capturing stream has unjoined "
        "work"), "train_step (update 1)", "cudnn", config, 200)
    assert "failed on the device capturing a CUDA graph" in str(capture)
    assert "try --config.model.attention_backend=fused, or XLA_FLAGS=--xla_gpu_enable_command_buffer=" in str(capture)
    assert str(capture).endswith("(the last good checkpoint, step 200, is kept; the same command resumes from it)")


def test_updates_non_finite_from_the_first_blame_the_forward_or_backward_pass_not_the_learning_rate(trained_run,
                                                                                                  tmp_path):
    """A train step whose forward pass gives NaN (the parameters it sees are NaN) from the first update of a start."""
    import jax.numpy as jnp

    from runs import snapshot

    def poisoned(real, state, batch):
        nan_params = jax.tree.map(lambda p: p * jnp.nan, state.params)
        new_state, metrics = real(state.replace(params=nan_params), batch)
        return new_state.replace(params=state.params), metrics  # skipped: Adam's state is left as it was

    workdir = copy_run(trained_run, tmp_path / "run")  # resumed at step 6
    before = snapshot(workdir / "checkpoints")
    config = resumed_to_10()
    trainer = with_train_step(Trainer(assemble_run(config, str(workdir))), poisoned)
    with pytest.raises(TrainingError) as stopped:
        trainer.run()
    trainer.close()
    line = str(stopped.value)
    for fragment in ("2 updates in a row had a non-finite loss or gradient",
                     "no update since the checkpoint of step 6 changed the parameters",
                     "the forward or backward pass gives non-finite values, not the learning rate",
                     "the attention runs on einsum; try --config.model.attention_backend=fused",
                     "(the last good checkpoint, step 6, is kept)"):
        assert fragment in line, line
    assert "learning_rate_scale" not in line
    assert snapshot(workdir / "checkpoints") == before


def test_the_non_finite_advice_is_the_learning_rate_only_once_updates_moved_the_parameters(run_config):
    from transformer_jax.run.failures import non_finite_advice
    from transformer_jax.training.optimizer import paper_learning_rate

    base = paper_learning_rate(512, 4000)  # the paper's warm-up: ~1.7e-7 a step at first
    advice = lambda schedule, start, applied, step: non_finite_advice(  # noqa: E731
        run_config.training, schedule, start, applied, step, "cudnn", "bfloat16")
    early = advice(base, 0, 5, 0)
    assert "the updates since the initialization moved each parameter by at most about 3e-06" in early
    assert "try --config.model.attention_backend=fused, or --config.model.dtype=float32" in early
    assert "no update since the initialization changed the parameters" in advice(base, 0, 0, 0)
    assert "no update since the checkpoint of step 900 changed" in advice(base, 880, 880, 900)
    assert "lower training.learning_rate_scale (it is 1)" in advice(base, 0, 2000, 0)  # 0.17 in all: the rate
    assert "lower training.learning_rate_scale" in advice(paper_learning_rate(512, 4000, 1e30), 0, 1, 0)
