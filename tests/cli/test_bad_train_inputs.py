"""A catalogue of what a user can get wrong when starting train.py: settings, config files, the data, the workdir.

Every row expects: a non-zero exit, exactly one `error: ...` line naming the problem and the fix, no traceback, and
an existing workdir left byte for byte as it was. The rows run against one trained workdir (runs.run_rows, one
process); the other tests' command lines run in that process too, after the rows (TRAININGS: a read-only or
unwritable workdir, learning rates that make the loss non-finite, parameters in bfloat16), except the resume past a
damaged checkpoint, whose promise includes what the process prints as it exits (its own train.py process); a
fine-tune's settings are checked in this process.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess

import jax
import numpy as np
import pytest

from runs import ROOT, assert_one_line_error, copy_run, run_rows, run_script, small_disk, snapshot, write_config
from transformer_jax.base import workdir as layout
from transformer_jax.base.lock import Owner
from transformer_jax.checkpoints.manager import Checkpointer


def write_text_corpus(directory: pathlib.Path, **files: bytes) -> pathlib.Path:
    """train/dev/test .en/.de files with one good pair each, replaced by `files` ({"train_de": b"..."})."""
    directory.mkdir()
    for split in ("train", "dev", "test"):
        for lang, text in (("en", b"The dog sleeps .\n"), ("de", b"Der Hund schl\xc3\xa4ft .\n")):
            content = files.get(f"{split}_{lang}", text)
            if content is not None:
                (directory / f"{split}.{lang}").write_bytes(content)
    return directory


BAD_CONFIGS = {
    "syntax_error.py": "def get_config(:\n    pass\n",
    "name_error.py": "def get_config():\n    return true\n",
    "dict_config.py": "def get_config():\n    return {'model': {'d_model': 512}}\n",
    "none_config.py": "def get_config():\n    config = 1\n",
    "typo_config.py": "import sys\nsys.path.insert(0, {tests!r})\nfrom runs import tiny_run_config\n\n"
                      "def get_config():\n    config = tiny_run_config()\n    config.training.num_train_step = 3\n"
                      "    return config\n",
    "string_config.py": "from transformer_jax.config import default_config\n\ndef get_config():\n"
                        "    config = default_config()\n    config.data.vocab_size = '500'\n    return config\n",
}


def owned_copy(workdir: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
    """A copy of the run at `path` that another live job (on another host) holds: its lock names that job."""
    shutil.copytree(workdir, path)
    (path / layout.LOCK).write_text(json.dumps(dataclasses.asdict(
        dataclasses.replace(Owner.this_process(), host="another-host", pid=4242))))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory, trained_run):
    """A trained tiny run (checkpoints, tokenizer, config.json, logs), a copy of it owned by another job, and bad
    config files, corpora and run configs next to it."""
    directory = tmp_path_factory.mktemp("bad_train_inputs")
    config = write_config(directory)
    workdir = copy_run(trained_run, directory / "run")
    corpora = {
        "missing": write_text_corpus(directory / "missing", dev_de=None),
        "mismatch": write_text_corpus(directory / "mismatch", train_en=b"One .\nTwo .\nThree .\n"),
        "latin1": write_text_corpus(directory / "latin1", train_de=b"Der Hund schl\xe4ft .\n"),
        "empty": write_text_corpus(directory / "empty", train_en=b"", train_de=b""),
    }
    (directory / "a_file").write_text("not a directory")
    for name, text in BAD_CONFIGS.items():
        (directory / name).write_text(text.replace("{tests!r}", repr(str(ROOT / "tests"))))
    (directory / "dangling").symlink_to(directory / "gone")  # a workdir link to a directory that is not there
    owned = owned_copy(workdir, directory / "owned")
    (directory / "damaged.json").write_text((workdir / "config.json").read_text()[:300])  # cut short (a full disk)
    edited = json.loads((workdir / "config.json").read_text())  # a value changed by hand to one no run can use
    edited["model"]["d_ff"] = -5
    (directory / "edited.json").write_text(json.dumps(edited, indent=2))
    lacking = json.loads((workdir / "config.json").read_text())  # as from an older version: settings absent
    del lacking["training"]["warmup_steps"], lacking["model"]["dropout_rate"]
    (directory / "lacking.json").write_text(json.dumps(lacking, indent=2))
    corpora["dir_as_file"] = write_text_corpus(directory / "dir_as_file", train_en=None)
    (corpora["dir_as_file"] / "train.en").mkdir()
    corpora["pipe_as_file"] = write_text_corpus(directory / "pipe_as_file", train_en=None)
    os.mkfifo(corpora["pipe_as_file"] / "train.en")  # reading it would wait for a writer forever
    return {"config": config, "workdir": workdir, "dir": directory, "owned": owned, **corpora}


def text_source(name: str):
    return lambda s: ["--config.data.source=text", f"--config.data.path={s[name]}"]


def fresh(*flags: str):
    """Flags for a workdir that does not exist yet (it must not exist after the failed start either)."""
    return lambda s: [*flags, f"--workdir={s['dir'] / 'fresh'}"]


def from_trained(*flags: str):
    """Flags of a new run (see `fresh`) fine-tuned from the trained run."""
    return lambda s: [f"--config.training.init_from={s['workdir']}", *flags, f"--workdir={s['dir'] / 'fresh'}"]


def on_fresh(flags):
    """A row's flags given the setup, on a workdir that does not exist yet (see `fresh`)."""
    return lambda s: [*flags(s), f"--workdir={s['dir'] / 'fresh'}"]


# (row, train.py flags given the setup (after --config and --workdir of the trained run), fragments of the
# error line: the problem, then the fix)
TRAIN_ROWS = [
    ("unknown config key", lambda s: ["--config.model.num_hedas=2"],
     ["unknown key --config.model.num_hedas", "did you mean --config.model.num_heads=2?"]),
    ("unknown flag", lambda s: ["--num_steps=3"], ["Unknown command line flag num_steps", "see --help"]),
    ("value of the wrong type", lambda s: ["--config.training.num_train_steps=ten"],
     ["--config.training.num_train_steps=ten", "invalid literal for int()"]),
    ("d_model not divisible by num_heads", lambda s: ["--config.model.num_heads=3"],
     ["d_model=32 is not divisible by num_heads=3"]),
    ("zero size", lambda s: ["--config.data.tokens_per_batch=0"],
     ["data.tokens_per_batch=0 must be positive", "--config.data.tokens_per_batch"]),
    ("negative model size", lambda s: ["--config.model.d_ff=-64"], ["d_ff=-64 must be a positive integer"]),
    ("negative training setting", lambda s: ["--config.training.checkpoint_every=-1"],
     ["training.checkpoint_every=-1 must be positive"]),
    ("negative learning rate", lambda s: ["--config.training.learning_rate_scale=-1"],
     ["training.learning_rate_scale=-1.0 must be positive"]),
    ("label smoothing of 1 or more", lambda s: ["--config.training.label_smoothing=1.5"],
     ["training.label_smoothing=1.5 must be in [0, 1)", "--config.training.label_smoothing"]),
    ("Adam beta of 1", lambda s: ["--config.training.adam_b2=1.0"], ["training.adam_b2=1.0 must be in [0, 1)"]),
    ("zero Adam epsilon", lambda s: ["--config.training.adam_eps=0.0"], ["training.adam_eps=0.0 must be positive"]),
    ("infinite learning rate", lambda s: ["--config.training.learning_rate_scale=inf"],
     ["training.learning_rate_scale=inf must be a finite number", "--config.training.learning_rate_scale"]),
    ("infinite Adam epsilon", lambda s: ["--config.training.adam_eps=inf"],
     ["training.adam_eps=inf must be a finite number"]),
    ("LayerNorm epsilon that is not a number", lambda s: ["--config.model.layer_norm_epsilon=nan"],
     ["model.layer_norm_epsilon=nan must be a finite number"]),
    ("dropout of 1 or more", lambda s: ["--config.model.dropout_rate=1.5"], ["dropout_rate=1.5 must be in [0, 1)"]),
    ("unknown model choice", lambda s: ["--config.model.norm_position=middle"],
     ["norm_position='middle' is not one of ['post', 'pre']"]),
    ("unknown dtype", lambda s: ["--config.model.dtype=float8"], ["dtype='float8' is not one of"]),
    ("positions shorter than the data", lambda s: ["--config.model.max_len=10"],
     ["model.max_len=10 is shorter than data.max_length + 1 = 65", "raise model.max_len"]),
    ("mesh larger than the devices", lambda s: ["--config.mesh.data=3"],
     ["mesh data=3 x fsdp=1 does not cover the 1 available devices", "--config.mesh.data"]),
    ("zero fsdp axis", lambda s: ["--config.mesh.fsdp=0"], ["mesh.fsdp=0 must be positive"]),
    # Absurd sizes: refused by what an int32 holds before anything is read, or by what a device holds before the
    # model is built (a billion layers would take minutes to trace).
    ("a layer count no 32-bit integer holds", lambda s: ["--config.model.num_layers=99999999999999999999"],
     ["model.num_layers=99999999999999999999 is larger than a run can hold", "--config.model.num_layers lower"]),
    ("a d_ff no 32-bit integer holds", lambda s: ["--config.model.d_ff=99999999999999999999"],
     ["model.d_ff=99999999999999999999 is larger than a run can hold (2**31 - 1"]),
    ("a vocabulary no 32-bit integer holds", lambda s: ["--config.data.vocab_size=99999999999999999999"],
     ["data.vocab_size=99999999999999999999 is larger than a run can hold", "--config.data.vocab_size lower"]),
    ("a batch no 32-bit integer holds", lambda s: ["--config.data.tokens_per_batch=4294967296"],
     ["data.tokens_per_batch=4294967296 is larger than a run can hold"]),
    # Fine-tuning (training.init_from): the source run fixes the model and the vocabulary; the command line's own
    # settings of them are refused, naming each (the trained run is d_model=32, 1 layer, 500 pieces).
    ("fine-tune given another model size", from_trained("--config.model.d_model=64", "--config.model.num_layers=3"),
     ["fixes the model and the vocabulary, so --config.model.num_layers=3, --config.model.d_model=64 cannot apply",
      "that run has model.num_layers=1, model.d_model=32", "drop those flags"]),
    ("fine-tune given its own vocabulary", from_trained("--config.data.vocab_size=300"),
     ["--config.data.vocab_size=300 cannot apply", "data.vocab_size=500"]),
    ("fine-tune given another norm position", from_trained("--config.model.norm_position=pre"),
     ["--config.model.norm_position='pre' cannot apply", "model.norm_position='post'"]),
    ("a model no device here holds", fresh("--config.model.num_layers=1000000"),
     ["the train state (parameters and Adam moments of", "1000000 layers", "GB per device", "--config.mesh.fsdp"]),
    ("zero data axis", lambda s: ["--config.mesh.data=0"], ["mesh.data=0 must be positive, or -1"]),
    # Data settings of a new run (on the trained workdir they would be refused as other than its corpus's).
    ("unknown data source", fresh("--config.data.source=nonsense"),
     ["data.source='nonsense' is not one of ['builtin', 'tfds', 'text', 'tsv']", "set --config.data.source"]),
    ("language the built-in corpus lacks", fresh("--config.data.source_lang=fr"),
     ["the built-in corpus is en<->de, not fr->de"]),
    ("batch smaller than one row", lambda s: ["--config.data.tokens_per_batch=32"],
     ["data.tokens_per_batch=32 cannot hold one row of max_length=64", "raise tokens_per_batch"]),
    ("missing data file", on_fresh(text_source("missing")), ["dev.de does not exist", "check the data directory"]),
    ("line counts differ", on_fresh(text_source("mismatch")), ["train.en has 3 lines but", "train.de has 1", "line-aligned"]),
    ("not UTF-8", on_fresh(text_source("latin1")), ["train.de line 1 is not valid UTF-8 (byte 0xe4)", "re-encode"]),
    ("empty corpus", on_fresh(text_source("empty")), ["train.en and", "are empty", "one sentence per line"]),
    ("data source changed on resume", text_source("mismatch"),
     ["data.source='text' differs from the 'builtin' that", "--config.data.source='builtin', or use a new workdir"]),
    ("seed changed on resume", lambda s: ["--config.training.seed=5"],
     ["training.seed=5 differs from the 0 that", "corpus was prepared with", "--config.training.seed=0, or use a new workdir"]),
    ("built-in test size changed on resume", lambda s: ["--config.data.builtin_test_size=300"],
     ["data.builtin_test_size=300 differs from the 16 that", "--config.data.builtin_test_size=16"]),
    ("shapes differ from the checkpoint", lambda s: ["--config.model.d_ff=128"],
     ["model.d_ff 64 -> 128 would change the parameters that the checkpoints in", "pass --config.model.d_ff=64 to "
      "resume"]),
    ("model vocabulary disagrees with the tokenizer", lambda s: ["--config.model.vocab_size=123"],
     ["model.vocab_size=123 disagrees with the tokenizer's", "set --config.model.vocab_size=0"]),
    ("tokenizer settings changed on resume", lambda s: ["--config.data.vocab_size=300"],
     ["data.vocab_size=300 differs from the 500", "--config.data.vocab_size=500"]),
    ("fewer steps than the run has done", lambda s: ["--config.training.num_train_steps=4"],
     ["training.num_train_steps=4 is below step 6", "--config.training.num_train_steps=6 or more"]),
    ("a run's config.json given as --config", lambda s: [f"--config={s['workdir'] / 'config.json'}"],
     ["config.json is a JSON file, but a config is a Python file",
      "--config=configs/rerun.py:"]),
    ("a run's config.json through configs/rerun.py (it is the run's: fewer steps is the error)",
     lambda s: [f"--config=configs/rerun.py:{s['workdir'] / 'config.json'}", "--config.training.num_train_steps=4"],
     ["training.num_train_steps=4 is below step 6"]),
    ("a damaged config.json through configs/rerun.py", lambda s: [f"--config=configs/rerun.py:{s['dir']}/damaged.json"],
     ["damaged.json is damaged (Unterminated string", "restore it"]),
    ("get_config() returning None", lambda s: [f"--config={s['dir'] / 'none_config.py'}"],
     ["none_config.py: get_config() returned None (a missing return statement?)", "default_config()"]),
    ("get_config() returning None, with an override", lambda s: [f"--config={s['dir'] / 'none_config.py'}",
                                                                 "--config.model.d_model=64"],
     ["none_config.py: get_config() returned None"]),
    ("get_config() returning None, with a data override", lambda s: [f"--config={s['dir'] / 'none_config.py'}",
                                                                      "--config.data.vocab_size=64"],
     ["none_config.py: get_config() returned None"]),
    ("config file with a syntax error", lambda s: [f"--config={s['dir'] / 'syntax_error.py'}"],
     ["syntax_error.py:1: invalid syntax", "a config is a Python file defining get_config()"]),
    ("config file that fails when run", lambda s: [f"--config={s['dir'] / 'name_error.py'}"],
     ["name_error.py:2: NameError: name 'true' is not defined"]),
    ("missing config file", lambda s: [f"--config={s['dir'] / 'none.py'}"], ["none.py: no such file"]),
    ("workdir owned by another job", lambda s: [f"--workdir={s['owned']}"],
     ["is in use by another training job (host another-host, pid 4242, started ", "choose another --workdir"]),
    ("workdir that is a file", lambda s: [f"--workdir={s['dir'] / 'a_file'}"],
     ["a_file is a file, not a directory", "choose another --workdir"]),
    ("empty workdir flag", lambda s: ["--workdir="], ["--workdir is empty"]),
    ("seed below zero", lambda s: ["--config.training.seed=-1"],
     ["training.seed=-1 must be an integer in [0, 2**63 - 1]", "--config.training.seed"]),
    ("seed past 64 bits", lambda s: ["--config.training.seed=9223372036854775808"],
     ["training.seed=9223372036854775808 must be an integer in [0, 2**63 - 1]"]),
    ("a misspelt key in a config file", lambda s: [f"--config={s['dir'] / 'typo_config.py'}"],
     ["config key training.num_train_step is not a setting", 'did you mean "training.num_train_steps"?']),
    ("a string for a number in a config file", lambda s: [f"--config={s['dir'] / 'string_config.py'}"],
     ["string_config.py:5: TypeError: Could not override field 'vocab_size'"]),
    ("an argument the config file does not take", lambda s: ["--config=configs/smoke.py:foo"],
     ["get_config() of configs/smoke.py takes no argument; drop the ':foo'"]),
    ("configs/rerun.py without the run's config.json", lambda s: ["--config=configs/rerun.py"],
     ["get_config() of configs/rerun.py needs an argument", "--config=configs/rerun.py:RUN/config.json"]),
    ("more steps than a run counts", lambda s: ["--config.training.num_train_steps=3000000000"],
     ["training.num_train_steps=3000000000 is more steps than a run counts (2**31 - 1)"]),
    ("beam wider than the vocabulary allows", lambda s: ["--config.eval.beam_size=300"],
     ["eval.beam_size=300 needs a vocabulary of at least 600 pieces (it has 500)", "--config.eval.beam_size lower"]),
    ("workdir that is a link to nowhere", lambda s: [f"--workdir={s['dir'] / 'dangling'}"],
     ["dangling is a symbolic link to", "gone, which does not exist", "create that directory or fix the link"]),
    ("config file whose get_config() returns a dict", lambda s: [f"--config={s['dir'] / 'dict_config.py'}"],
     ["get_config() returned a dict, not an ml_collections.ConfigDict", "default_config()"]),
    ("a hand-edited config.json through configs/rerun.py",
     lambda s: [f"--config=configs/rerun.py:{s['dir'] / 'edited.json'}"],
     ["edited.json holds a setting no run can use: model.d_ff=-5 must be a positive integer", "correct it in"]),
    ("a config.json lacking settings through configs/rerun.py",
     lambda s: [f"--config=configs/rerun.py:{s['dir'] / 'lacking.json'}"],
     ["lacking.json lacks 2 setting(s) a rerun needs (model.dropout_rate=0.1, training.warmup_steps=4000: the "
      "defaults", "add each with the value that run used"]),
    ("fsdp axis that does not divide the devices", lambda s: ["--config.mesh.fsdp=2"],
     ["mesh.fsdp=2 does not divide the 1 available devices, so mesh.data=-1 cannot take the rest",
      "--config.mesh.fsdp to a divisor of 1"]),
    ("cuDNN attention without a GPU", lambda s: ["--config.model.attention_backend=cudnn"],
     ["model.attention_backend='cudnn' needs NVIDIA GPUs, but this run's devices are cpu",
      "--config.model.attention_backend=fused"]),
    ("parameters larger than the device", fresh("--config.model.d_ff=2000000000"),
     ["the train state (parameters and Adam moments of d_model=32, d_ff=2000000000", "GB per device, but a cpu",
      "lower the model's sizes", "--config.mesh.fsdp"]),
    ("compilation cache that is a file", lambda s: [f"--compilation_cache={s['dir'] / 'a_file'}"],
     ["a_file is not a directory", "--compilation_cache= to turn it off"]),
    ("coordinator address without a port",
     lambda s: ["--multihost", "--coordinator_address=localhost", "--num_processes=1", "--process_id=0"],
     ["--coordinator_address=localhost has no port", "pass HOST:PORT of process 0"]),
    ("coordinator port beyond 65535",  # named at once, not waited for until --cluster_timeout
     lambda s: ["--multihost", "--coordinator_address=127.0.0.1:70000", "--num_processes=2", "--process_id=1"],
     ["--coordinator_address=127.0.0.1:70000: port 70000 is not a TCP port (1 to 65535)"]),
    ("data directory flag left empty", fresh("--config.data.source=text"),
     ["data source 'text' needs a data directory and data.path is empty", "--config.data.path=DIR"]),
    ("a directory in place of a data file", on_fresh(text_source("dir_as_file")),
     ["dir_as_file/train.en is a directory, not a text file"]),
    ("a named pipe in place of a data file", on_fresh(text_source("pipe_as_file")),
     ["pipe_as_file/train.en is not a regular file (a named pipe", "write it to a regular file first"]),
    # A first start that fails leaves no workdir behind, whatever it had made by then.
    ("batch larger than the device", fresh("--config.data.tokens_per_batch=2000000000"),
     ["the train step 31250000x64 (rows x tokens) needs", "lower data.tokens_per_batch (now 2000000000)",
      "--config.training.accumulation_steps"]),
    ("bad search setting on a new workdir", fresh("--config.eval.alpha=-1"),
     ["eval.alpha=-1.0 must be >= 0", "--config.eval.alpha"]),
    ("no pair as short as max_length on a new workdir",  # the width from the corpus (the tiny run's is 64)
     fresh("--config.data.max_length=1", "--config.data.row_width=0"),
     ["no training pair fits max_length=1 tokens", "raise --config.data.max_length"]),
    ("batch smaller than one row on a new workdir", fresh("--config.data.tokens_per_batch=63"),
     ["data.tokens_per_batch=63 cannot hold one row of max_length=64"]),
    ("vocabulary larger than the corpus supports", fresh("--config.data.vocab_size=50000"),
     ["data.vocab_size=50000 is more than this corpus supports: SentencePiece built only",
      "set --config.data.vocab_size="]),
    ("data check failing on a new workdir", lambda s: [*text_source("mismatch")(s), f"--workdir={s['dir'] / 'fresh'}"],
     ["train.en has 3 lines but"]),
]


NON_FINITE_RATES = [
    ("--config.training.learning_rate_scale=1e30", "lower training.learning_rate_scale (it is 1e+30)"),
    ("--config.training.peak_learning_rate=1e9", "lower training.peak_learning_rate (it is 1e+09)"),
    ("--config.training.peak_learning_rate=1e30", "lower training.peak_learning_rate (it is 1e+30)"),
]


def trainings(s: dict) -> dict[str, list[str]]:
    """The other tests' train.py command lines given the setup (whole: --config and --workdir included), run after
    TRAIN_ROWS in the same process; "read-only" runs while s["dir"]/"disk" is a read-only file system."""
    config = f"--config={s['config']}"
    lines = {
        "read-only": [config, f"--workdir={s['dir'] / 'disk' / 'run'}"],
        "unwritable": [config, f"--workdir={s['dir'] / 'a_file' / 'run'}"],
        "non-finite after a checkpoint": [config, f"--workdir={s['dir'] / 'non_finite'}",
                                          "--config.training.num_train_steps=12",
                                          "--config.training.learning_rate_scale=1e30",
                                          "--config.training.max_skipped_updates=2"],
        "bfloat16": [config, f"--workdir={s['dir'] / 'bfloat16'}", "--config.model.param_dtype=bfloat16",
                     "--config.training.num_train_steps=2", "--config.training.eval_every=0",
                     "--config.training.checkpoint_every=2"],
    }
    for index, (rate, _) in enumerate(NON_FINITE_RATES):
        lines[rate] = [config, f"--workdir={s['dir'] / f'new{index}' / 'run'}", "--config.training.num_train_steps=3",
                       rate, "--config.training.max_skipped_updates=2", "--config.training.eval_every=0"]
    return lines


@pytest.fixture(scope="module")
def train_results(setup):
    """Every TRAIN_ROWS command (after --config and --workdir of the trained run), and the workdirs before and after;
    then, in the same process, the trainings' command lines (their results under their own names, in the first
    dict)."""
    workdirs = [setup["workdir"], setup["owned"]]
    shutil.copytree(setup["workdir"], setup["dir"] / "non_finite")
    before = [snapshot(w) for w in workdirs]
    rows = []
    for _, flags, _ in TRAIN_ROWS:
        row = flags(setup)  # a row's own --config replaces the tiny run's (two would both be loaded)
        config = [] if any(flag.startswith("--config=") for flag in row) else [f"--config={setup['config']}"]
        rows.append([*config, f"--workdir={setup['workdir']}", *row])
    extra = trainings(setup)
    with small_disk(setup["dir"] / "disk", "1m") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        results = run_rows("train.py", rows + list(extra.values()), setup["dir"])
    named = dict(zip([row[0] for row in TRAIN_ROWS] + list(extra), results))
    return named, before, [snapshot(w) for w in workdirs]


@pytest.mark.parametrize("row", TRAIN_ROWS, ids=[row[0] for row in TRAIN_ROWS])
def test_train_py_rejects_bad_input_without_touching_the_workdir(setup, train_results, row):
    name, _, fragments = row
    results, before, after = train_results
    assert_one_line_error(results[name], *fragments)
    assert after == before  # the trained run and the owned one, byte for byte (the lock of the owned one too)
    assert not (setup["dir"] / "fresh").exists()
    assert "Traceback" not in results[name].stdout


def test_get_config_returning_none_is_the_only_line(setup, train_results):
    """No warning of the config loader before the one line (it printed absl's WARNING and W-lines first)."""
    results, _, _ = train_results
    stderr = results["get_config() returning None"].stderr.strip()
    assert stderr.startswith("error: ") and len(stderr.splitlines()) == 1, stderr


def test_a_workdir_on_a_read_only_file_system_says_so(setup, train_results):
    disk = setup["dir"] / "disk"  # a 1m file system, read-only while the command ran
    assert_one_line_error(train_results[0]["read-only"], f"writing to the workdir {disk / 'run'}",
                          "read-only file system", "make", "writable or choose another --workdir")


def test_unwritable_workdir(setup, train_results):
    # A path under a regular file cannot be created, even by root (which ignores permission bits).
    assert_one_line_error(train_results[0]["unwritable"], "a_file/run is not writable", "choose another --workdir")
    assert (setup["dir"] / "a_file").read_text() == "not a directory"


def test_resuming_past_a_damaged_checkpoint_prints_one_warning_and_no_traceback(setup, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(setup["workdir"], workdir)
    data = max((p for p in (workdir / "checkpoints" / "6" / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={workdir}",
                        "--config.training.eval_every=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr[-3000:]
    about_it = [line for line in result.stderr.splitlines() if "checkpoints/6" in line]
    assert len(about_it) == 1, result.stderr[-3000:]
    assert "cannot be read" in about_it[0] and "checkpoints.corrupt/6" in about_it[0]
    assert "resuming from step 4" in about_it[0]


def test_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(setup, train_results):
    workdir = setup["dir"] / "non_finite"  # a copy of the trained run; its checkpoints are the trained run's
    assert_one_line_error(train_results[0]["non-finite after a checkpoint"], "non-finite loss or gradient",
                          "lower training.learning_rate_scale", "(the last good checkpoint, step 6, is kept)")
    assert snapshot(workdir / "checkpoints") == snapshot(setup["workdir"] / "checkpoints")
    checkpointer = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    params = checkpointer.restore_params(checkpointer.latest_step())
    assert checkpointer.latest_step() == 6
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("rate,advice", NON_FINITE_RATES)
def test_non_finite_loss_before_any_checkpoint_names_the_rate_and_leaves_no_workdir(setup, train_results, rate,
                                                                                   advice):
    """The advice names the learning-rate setting the run uses; a first start that saved nothing leaves nothing."""
    assert_one_line_error(train_results[0][rate], "non-finite loss or gradient", "(no checkpoint was written)", advice)
    index = [r for r, _ in NON_FINITE_RATES].index(rate)
    assert not (setup["dir"] / f"new{index}").exists()


def test_bfloat16_parameters_train_save_and_score_through_the_command_line(setup, train_results):
    # model.param_dtype=bfloat16 is documented; its compiled step failed (gradients promoted to float32).
    result = train_results[0]["bfloat16"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test SacreBLEU" in result.stdout
    params = Checkpointer(str(setup["dir"] / "bfloat16" / "checkpoints"), read_only=True).restore_params(2)
    assert {np.asarray(leaf).dtype.name for leaf in jax.tree.leaves(params)} == {"bfloat16"}


def test_a_fine_tune_keeps_settings_equal_to_its_source_and_names_the_config_files_it_replaces(setup, capsys):
    """The command line may repeat the source's own values; the config file's other values are replaced, said."""
    from transformer_jax.checkpoints.initial import adopt_initial_model
    from transformer_jax.config import default_config

    config = default_config()
    config.training.init_from = str(setup["workdir"])
    config.model.d_model = 32  # as --config.model.d_model=32 sets it
    adopted = adopt_initial_model(config, str(setup["dir"] / "tuned"), explicit={"model.d_model": 32})
    assert (adopted.model.d_model, adopted.model.num_layers, adopted.data.vocab_size) == (32, 1, 500)
    said = capsys.readouterr()
    line = [line for line in (said.out + said.err).splitlines() if "training.init_from=" in line]
    assert len(line) == 1 and "model.num_layers=6 (now 1)" in line[0] and "d_model" not in line[0]
    assert "data.vocab_size=32000 (now 500)" in line[0]
    assert not (setup["dir"] / "tuned").exists()
