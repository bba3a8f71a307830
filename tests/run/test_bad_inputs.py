"""A catalogue of what a user can get wrong, each run as the real command line.

Every row expects: a non-zero exit, exactly one `error: ...` line naming the problem and the fix, no
traceback, and an existing workdir left byte for byte as it was. Train.py rows run against one
trained workdir; eval.py rows against copies of it.
"""

import pathlib
import shutil

import jax
import numpy as np
import pytest

from runs import assert_one_line_error, run_script, snapshot, tiny_run_config, write_config
from transformer_jax.training.checkpoints import Checkpointer
from transformer_jax.training.loop import Trainer


def write_text_corpus(directory: pathlib.Path, **files: bytes) -> pathlib.Path:
    """train/dev/test .en/.de files with one good pair each, replaced by `files` ({"train_de": b"..."})."""
    directory.mkdir()
    for split in ("train", "dev", "test"):
        for lang, text in (("en", b"The dog sleeps .\n"), ("de", b"Der Hund schl\xc3\xa4ft .\n")):
            content = files.get(f"{split}_{lang}", text)
            if content is not None:
                (directory / f"{split}.{lang}").write_bytes(content)
    return directory


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A trained tiny run (checkpoints, tokenizer, config.json, logs) and bad corpora next to it."""
    directory = tmp_path_factory.mktemp("bad_inputs")
    config = write_config(directory)
    workdir = directory / "run"

    trainer = Trainer(tiny_run_config(), str(workdir))
    trainer.run()
    trainer.close()
    corpora = {
        "missing": write_text_corpus(directory / "missing", dev_de=None),
        "mismatch": write_text_corpus(directory / "mismatch", train_en=b"One .\nTwo .\nThree .\n"),
        "latin1": write_text_corpus(directory / "latin1", train_de=b"Der Hund schl\xe4ft .\n"),
        "empty": write_text_corpus(directory / "empty", train_en=b"", train_de=b""),
    }
    (directory / "a_file").write_text("not a directory")
    return {"config": config, "workdir": workdir, "dir": directory, **corpora}


def text_source(name: str):
    return lambda s: ["--config.data.source=text", f"--config.data.path={s[name]}"]


# (row, extra train.py flags given the setup, fragments of the error line: the problem, then the fix)
TRAIN_ROWS = [
    ("unknown config key", lambda s: ["--config.model.num_hedas=2"], ["num_hedas", 'Did you mean "num_heads"']),
    ("d_model not divisible by num_heads", lambda s: ["--config.model.num_heads=3"],
     ["d_model=32 is not divisible by num_heads=3"]),
    ("zero size", lambda s: ["--config.data.tokens_per_batch=0"],
     ["data.tokens_per_batch=0 must be positive", "--config.data.tokens_per_batch"]),
    ("negative model size", lambda s: ["--config.model.d_ff=-64"], ["d_ff=-64 must be a positive integer"]),
    ("negative training setting", lambda s: ["--config.training.checkpoint_every=-1"],
     ["training.checkpoint_every=-1 must be positive"]),
    ("missing data file", text_source("missing"), ["dev.de does not exist", "check the data directory"]),
    ("line counts differ", text_source("mismatch"), ["train.en has 3 lines but", "train.de has 1", "line-aligned"]),
    ("not UTF-8", text_source("latin1"), ["train.de line 1 is not valid UTF-8 (byte 0xe4)", "re-encode"]),
    ("empty corpus", text_source("empty"), ["train.en and", "are empty", "one sentence per line"]),
    ("shapes differ from the checkpoint", lambda s: ["--config.model.d_ff=128"],
     ["does not match the config", "(128,) in the model", "use the config the run was started with"]),
    ("model vocabulary disagrees with the tokenizer", lambda s: ["--config.model.vocab_size=123"],
     ["model.vocab_size=123 disagrees with the tokenizer's", "set model.vocab_size=0"]),
    ("tokenizer settings changed on resume", lambda s: ["--config.data.vocab_size=300"],
     ["data.vocab_size=300 differs from the 500", "--config.data.vocab_size=500"]),
    ("multihost without a coordinator", lambda s: ["--multihost"],
     ["cannot join the multi-process run", "--coordinator_address=HOST:PORT"]),
]


@pytest.mark.parametrize("row", TRAIN_ROWS, ids=[row[0] for row in TRAIN_ROWS])
def test_train_py_rejects_bad_input_without_touching_the_workdir(setup, row):
    _, flags, fragments = row
    before = snapshot(setup["workdir"])
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={setup['workdir']}", *flags(setup))
    assert_one_line_error(result, *fragments)
    assert snapshot(setup["workdir"]) == before


def test_unwritable_workdir(setup):
    # A path under a regular file cannot be created, even by root (which ignores permission bits).
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={setup['dir'] / 'a_file' / 'run'}")
    assert_one_line_error(result, "a_file/run is not writable", "choose another --workdir")
    assert (setup["dir"] / "a_file").read_text() == "not a directory"


def test_eval_py_on_a_workdir_without_checkpoint(setup, tmp_path):
    for name in ("config.json", "tokenizer.model"):
        shutil.copy(setup["workdir"] / name, tmp_path / name)
    before = snapshot(tmp_path)
    assert_one_line_error(run_script("eval.py", f"--workdir={tmp_path}"), "no checkpoint in", "train first")
    assert snapshot(tmp_path) == before


def test_eval_py_on_a_damaged_checkpoint_names_it_and_the_way_out(setup, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(setup["workdir"], workdir)
    data = max((p for p in (workdir / "checkpoints" / "6" / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # a truncated copy
    before = snapshot(workdir)
    result = run_script("eval.py", f"--workdir={workdir}")
    # Orbax closes its event loop on the first failed read while other reads of the damaged files are
    # still in flight; their callbacks may print "Event loop is closed" tracebacks from background
    # threads (third-party noise). None may come from our code.
    assert not [line for line in result.stderr.splitlines() if 'File "' in line and "site-packages" not in line
                and "asyncio" not in line], result.stderr[-3000:]
    result.stderr = "\n".join(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert_one_line_error(result, "checkpoints/6 cannot be read", "choose another with --checkpoint=STEP")
    assert snapshot(workdir) == before


def test_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(setup, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(setup["workdir"], workdir)
    checkpoints = snapshot(workdir / "checkpoints")
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={workdir}",
                        "--config.training.num_train_steps=12", "--config.training.learning_rate_scale=1e30",
                        "--config.training.max_skipped_updates=2")
    assert_one_line_error(result, "non-finite loss or gradient", "lower training.learning_rate_scale")
    assert snapshot(workdir / "checkpoints") == checkpoints
    checkpointer = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    params = checkpointer.restore_params(checkpointer.latest_step())
    assert checkpointer.latest_step() == 6
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params))
