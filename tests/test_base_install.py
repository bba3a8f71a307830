"""The base install (`pip install transformer-jax`, no extras) runs the modules and decoding, without the training stack.

Builds a fresh virtualenv (not seeing this one's packages), installs the repository into it from PyPI
without extras, and there runs a forward pass, greedy decoding, beam search and the paper's loss and
optimizer, then checks that none of TensorFlow, TFDS, matplotlib or SacreBLEU was installed or
imported. About a minute from a warm pip cache (the download of JAX, Flax and their dependencies
otherwise).
"""

import json
import pathlib
import subprocess
import sys
import textwrap
import venv

from runs import ROOT

TRAINING_STACK = ("tensorflow", "tensorflow-datasets", "matplotlib", "sacrebleu")

IN_THE_BASE_INSTALL = textwrap.dedent(f"""
    import importlib.metadata, json, sys

    import jax
    import jax.numpy as jnp
    import optax

    import transformer_jax
    from transformer_jax import Transformer, TransformerConfig, beam_search, greedy_decode
    from transformer_jax.training import label_smoothed_cross_entropy, paper_learning_rate, paper_optimizer

    config = TransformerConfig(vocab_size=32, num_layers=1, d_model=16, d_ff=32, num_heads=2, max_len=16,
                               dropout_rate=0.0)
    src = jnp.array([[5, 6, 7, 2, 0]])
    tgt = jnp.array([[1, 8, 9, 2, 0]])
    model = Transformer(config)
    params = model.init(jax.random.key(0), src, tgt)["params"]
    logits = model.apply({{"params": params}}, src, tgt)
    greedy = greedy_decode(params, config, src, max_extra_length=3)
    beams, scores = beam_search(params, config, src, beam_size=2, max_extra_length=3)
    loss, _ = label_smoothed_cross_entropy(logits, tgt, 0.1)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model, 4))
    optimizer.init(params)
    try:
        import transformer_jax.run  # the training run (Trainer, the run builder): the `train` extra
        needs_extra = False
    except ModuleNotFoundError:
        needs_extra = True

    def installed(name):
        try:
            importlib.metadata.version(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            return False

    print(json.dumps({{
        "package": transformer_jax.__file__,
        "logits": list(logits.shape), "greedy": list(greedy.shape), "beams": list(beams.shape),
        "finite": bool(jnp.isfinite(logits).all() and jnp.isfinite(scores).all() and jnp.isfinite(loss).all()),
        "trainer_needs_extra": needs_extra,
        "installed": [name for name in {TRAINING_STACK!r} if installed(name)],
        "imported": sorted({{name.split(".")[0] for name in sys.modules}} & {{"tensorflow", "tensorflow_datasets",
                           "matplotlib", "sacrebleu", "tqdm", "orbax", "sentencepiece", "ml_collections"}}),
    }}))
""")


def test_base_install_runs_the_modules_and_decoding_without_the_training_stack(tmp_path):
    environment = tmp_path / "venv"
    # No pip of its own (seeding one costs seconds of CPU): this pip installs into it (`pip --python`) as its own would.
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(environment)
    python = str(environment / "bin" / "python")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                              "--disable-pip-version-check", "--no-compile", str(ROOT)],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]

    result = subprocess.run([python, "-c", IN_THE_BASE_INSTALL], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert pathlib.Path(report["package"]).is_relative_to(environment)  # the installed copy, not this checkout
    assert report["logits"] == [1, 5, 32] and report["greedy"][0] == 1 and report["beams"][0] == 1
    assert report["finite"]
    assert report["trainer_needs_extra"]  # the loop is there, behind the `train` extra
    assert report["installed"] == []
    assert report["imported"] == []
    assert sys.prefix != str(environment)
