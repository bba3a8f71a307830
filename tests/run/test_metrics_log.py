"""run/metrics_log.py's Weights & Biases run (training.wandb_project), in W&B's offline mode: nothing leaves
this machine; the run's records are read back from the file W&B writes."""

import glob
import os

import pytest

from transformer_jax.base import workdir as layout
from transformer_jax.config import check_run_config, default_config
from transformer_jax.errors import ConfigError
from transformer_jax.run.metrics_log import MetricsLog


@pytest.fixture()
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any request W&B might try goes to a closed local port


def test_metrics_go_to_wandb_as_well_and_a_resume_logs_to_the_same_run(tmp_path, offline):
    workdir = str(tmp_path / "run")
    log = MetricsLog(workdir, resume_step=0, wandb_project="transformer_jax_test", run_config={"model": {"d_model": 8}})
    for step in (1, 2):
        log.write(step, "train", {"loss": 7.25 - step, "learning_rate": 1e-3})
    log.write(2, "dev", {"loss": 6.5})
    log.close()
    run_id = open(layout.run_path(workdir, layout.WANDB_RUN_ID)).read()
    resumed = MetricsLog(workdir, resume_step=2, wandb_project="transformer_jax_test")
    resumed.write(3, "train", {"loss": 4.125})
    resumed.close()
    import wandb

    wandb.teardown()  # finish() returns before W&B's service has closed the run's file; teardown waits for it
    runs = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*")), key=os.path.getctime)  # in logging order
    assert len(runs) == 2 and all(f"-{run_id}" in os.path.basename(path) for path in runs)  # one W&B run, logged twice
    first, second = (open(glob.glob(os.path.join(path, "run-*.wandb"))[0], "rb").read() for path in runs)
    for tag in (b"train/loss", b"train/learning_rate", b"dev/loss", b"d_model"):
        assert tag in first, tag
    assert b"6.25" in first and b"6.5" in first and b"4.125" in second and b"4.125" not in first
    assert open(layout.run_path(workdir, layout.METRICS)).read().count("\n") == 4  # metrics.jsonl as before


def test_a_project_without_wandb_installed_is_refused_at_start_up(monkeypatch):
    import importlib.util

    config = default_config()
    config.training.wandb_project = "mine"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'transformer_jax\[wandb\]'"):
        check_run_config(config)
