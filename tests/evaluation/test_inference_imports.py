"""Inference does not carry the trainer: importing the translation API, the search or the model loads no optax, no
train step (`transformer_jax.training`) and nothing of the training run (`transformer_jax.run`).

Each import runs in a fresh interpreter: this test process has the whole training stack loaded already.
"""

import subprocess
import sys

import pytest

from runs import ROOT, script_env

TRAINER = ("optax", "transformer_jax.training", "transformer_jax.run")


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after `statement` (run from the checkout)."""
    done = subprocess.run([sys.executable, "-c", f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"],
                          cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(done.stdout.split())


@pytest.mark.parametrize("statement, module", [
    ("from transformer_jax.evaluation import Translator", "transformer_jax.evaluation.translator"),
    ("import transformer_jax.decoding", "transformer_jax.decoding.beam_search"),
    ("import transformer_jax.model", "transformer_jax.model.transformer"),
])
def test_importing_what_translates_loads_no_optax_nor_train_step_nor_run(statement, module):
    loaded = loaded_after(statement)
    assert module in loaded  # the import ran: an empty list would pass the checks below
    trainer = sorted(name for name in loaded if any(name == top or name.startswith(top + ".") for top in TRAINER))
    assert not trainer, f"`{statement}` loads the trainer: {trainer[:8]}"


def test_the_score_path_still_reaches_the_dev_loss_when_called():
    # The dev-loss step is imported where evaluate_checkpoint runs it; the import must resolve.
    loaded = loaded_after("from transformer_jax.evaluation import evaluate_checkpoint\n"
                          "from transformer_jax.training.dev_loss import dev_loss_step, evaluate_loss")
    assert {"optax", "transformer_jax.training.dev_loss"} <= loaded
