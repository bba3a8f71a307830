"""The trained tiny run that the catalogue's test files (test_bad_inputs, test_damaged_runs, ...) start from."""

import pytest

from runs import tiny_run_config, write_config
from transformer_jax.training.loop import Trainer


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> dict:
    """A finished tiny run, trained once per session: {"config": its config file, "workdir": the run}.

    Read only: a test that changes a run copies it first (runs.copy_run).
    """
    directory = tmp_path_factory.mktemp("trained")
    config = write_config(directory)
    workdir = directory / "run"
    trainer = Trainer(tiny_run_config(), str(workdir))
    trainer.run()
    trainer.close()
    return {"config": config, "workdir": workdir}
