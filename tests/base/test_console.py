"""The console of a normal run: the bar and the lines a user needs, no INFO logging, no asyncio noise at exit."""

import re
import subprocess

from runs import NO_TEST_TRANSLATION, copy_run, run_script

INFO_LINE = re.compile(r"^(I\d{4} |INFO[: ])", re.M)  # absl's and Python's default formats


def test_a_normal_run_prints_what_the_user_needs_and_verbosity_brings_info_back(script_trained_run, tmp_path):
    """The first run is the shared one train.py trained (6 steps, what it printed kept), to its test translation and
    SacreBLEU; a copy of it resumes, without the test translation the first run already showed (eval.test_at_end)."""
    config, workdir = script_trained_run["config"], copy_run(script_trained_run, tmp_path / "run")
    first = subprocess.CompletedProcess([], 0, script_trained_run["stdout"], script_trained_run["stderr"])
    resumed = run_script("train.py", f"--config={config}", f"--workdir={workdir}",
                         "--config.training.num_train_steps=8", NO_TEST_TRANSLATION)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    evaluated = run_script("eval.py", f"--workdir={workdir}")  # restores with Orbax, which logs much at INFO
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    for result in (first, resumed, evaluated):
        console = result.stdout + result.stderr
        assert not INFO_LINE.search(console), INFO_LINE.search(console).string[-3000:]
        assert "Event loop is closed" not in console
    assert f"run directory {script_trained_run['trained_in']}" in first.stdout
    assert "step 3 dev: loss" in first.stdout
    assert "test SacreBLEU" in first.stdout
    assert f"resumed from {workdir}/checkpoints/6" in resumed.stdout
    assert "8/8" in resumed.stderr  # the bar reached the last step
    assert "training finished at step 8; no test translation" in resumed.stdout
    assert "SacreBLEU" in evaluated.stdout

    # The cheapest restore eval.py makes (one line, greedy): --verbosity=0 brings Orbax's INFO lines back.
    verbose = run_script("eval.py", f"--workdir={workdir}", "--translate=-", "--mode=greedy", "--verbosity=0",
                         stdin="The dog sleeps .\n")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert INFO_LINE.search(verbose.stderr)  # Orbax's restore lines are back
