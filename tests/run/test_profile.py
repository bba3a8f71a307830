"""The profiler switch (training.profile_steps): a trace of the updates asked for, read back per update."""

import jax
import jax.numpy as jnp

from runs import copy_run, tiny_run_config
from transformer_jax.base import workdir as layout
from transformer_jax.run import Trainer, assemble_run
from transformer_jax.run.profile import UpdateProfile
from transformer_jax.run.trace_summary import newest_trace, read_trace, summarize_trace


def test_a_run_traces_the_updates_asked_for_into_its_profile_folder(trained_run, tmp_path):
    workdir = copy_run(trained_run, tmp_path / "run")  # at step 6: the resume traces from its own start on
    config = tiny_run_config()
    config.training.update(num_train_steps=9, profile_steps=2, profile_skip_steps=1, eval_every=0, checkpoint_every=9)
    trainer = Trainer(assemble_run(config, str(workdir)))
    trainer.run()
    trainer.close()
    trace = newest_trace(str(workdir / layout.PROFILE))
    assert trace is not None
    summary = summarize_trace(read_trace(trace))
    steps = sorted(int(e["args"]["step_num"]) for e in read_trace(trace) if e.get("name") == "train")
    assert steps == [8, 9] and summary.updates == 2  # update 7 skipped after the resume, 8 and 9 traced
    # A CPU has no device tracks: the summary counts XLA's ops on host threads, and says so.
    assert summary.device == "host" and summary.launch is None and summary.kernels > 0 and summary.top
    assert 0 < summary.busy <= summary.wall and any("jit_train_step" in name for name in summary.programs)
    text = "\n".join(summary.lines())
    assert "no device tracks" in text and "kernels per update" not in text


def test_no_profile_by_default_and_a_profile_cut_short_is_still_written(tmp_path):
    step = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((64, 64))
    off = UpdateProfile(str(tmp_path / "off"), first=0, steps=0)
    with off.update(0, lambda: x):
        step(x)
    assert not (tmp_path / "off").exists()
    cut = UpdateProfile(str(tmp_path / "cut"), first=1, steps=5)
    for done in range(3):  # stopped (a signal, an error) after the second traced update
        with cut.update(done, lambda: x):
            x = step(x)
    assert cut.tracing
    cut.stop()
    assert not cut.tracing and summarize_trace(read_trace(newest_trace(str(tmp_path / "cut")))).updates == 2


def test_updates_dispatched_ahead_finish_before_the_trace_starts(tmp_path):
    step = jax.jit(lambda x: jnp.tanh(x @ x) / 64)
    x = jnp.ones((384, 384))
    profile = UpdateProfile(str(tmp_path), first=4, steps=2)
    for done in range(6):  # four updates queued ahead of the device, then two traced
        with profile.update(done, lambda: x):
            x = step(x)
    events = read_trace(newest_trace(str(tmp_path)))
    runs = {e["args"]["run_id"] for e in events if "hlo_op" in e.get("args", {})}
    assert len(runs) == 2 and summarize_trace(events).updates == 2  # the XLA executions are the traced ones
