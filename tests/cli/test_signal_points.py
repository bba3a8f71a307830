"""SIGTERM at each point of a run outside the training loop stops it cleanly: one line, exit 0, the lock
released, nothing half written, and the same command then finishes the run.

The loop's own handling (a checkpoint at a step boundary) is tested in tests/training/test_loop.py and,
across processes, in tests/training/test_multiprocess.py.
"""

import signal  # noqa: F401 - documents what tests/signal_at.py sends

import pytest

from runs import run_script, script_env, write_config
from transformer_jax.base import workdir as layout


def signalled_run(config, workdir, point, *flags):
    return run_script("tests/signal_at.py", f"--config={config}", f"--workdir={workdir}", *flags,
                      env=script_env(SIGNAL_AT=point))


def assert_stopped_cleanly(result, workdir, finished):
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"stopped by SIGTERM: {finished}") and last.endswith("resumes the run"), last
    assert not (workdir / layout.LOCK).exists()
    assert not [path for path in workdir.rglob("*") if ".tmp" in path.name], list(workdir.rglob("*"))


@pytest.mark.parametrize("point, flags, finished", [
    ("preparation", ("--multihost", "--num_processes=1", "--process_id=0"), "nothing; training had not started"),
    ("compiling", (), "nothing; training had not started"),
    ("final translation", (), "training finished at step 6"),
])
def test_sigterm_outside_the_loop_stops_cleanly_and_the_same_command_finishes(tmp_path, point, flags, finished):
    from runs import free_port

    config, workdir = write_config(tmp_path), tmp_path / "run"
    if flags:  # joined through jax.distributed, whose runtime must not take SIGTERM away from us
        flags += (f"--coordinator_address=localhost:{free_port()}",)
    assert_stopped_cleanly(signalled_run(config, workdir, point, *flags), workdir, finished)
    if point == "preparation":
        assert not (workdir / layout.CORPUS / "manifest.json").exists()  # an unfinished corpus is not taken
    rerun = run_script("train.py", f"--config={config}", f"--workdir={workdir}")
    assert rerun.returncode == 0 and "test SacreBLEU" in rerun.stdout, rerun.stderr[-3000:]
    if point == "final translation":
        assert "resumed from" in rerun.stdout  # training was not redone


def test_sigterm_during_a_periodic_evaluation_saves_a_checkpoint_and_the_same_command_finishes(tmp_path):
    """Inside the loop the signal is the loop's: the evaluation ends, a checkpoint is saved at that step."""
    config, workdir = write_config(tmp_path), tmp_path / "run"
    stopped = signalled_run(config, workdir, "evaluation")
    assert stopped.returncode == 0 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert "stopped by signal" in stopped.stderr and not (workdir / layout.LOCK).exists()
    assert sorted(int(p.name) for p in (workdir / layout.CHECKPOINTS).iterdir() if p.name.isdigit())[-1] == 3
    # Stopped again while the resumed run compiles: the line says what is on disk, not "nothing".
    assert_stopped_cleanly(signalled_run(config, workdir, "compiling"), workdir, "the newest checkpoint is step 3")
    rerun = run_script("train.py", f"--config={config}", f"--workdir={workdir}")
    assert rerun.returncode == 0 and "test SacreBLEU" in rerun.stdout, rerun.stderr[-3000:]
    assert "resumed from" in rerun.stdout
