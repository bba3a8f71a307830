"""A catalogue of what a user can get wrong, each run as the real command line.

Every row expects: a non-zero exit, exactly one `error: ...` line naming the problem and the fix, no
traceback, and an existing workdir left byte for byte as it was. Train.py rows run against one
trained workdir; eval.py rows against copies of it.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from runs import (
    ROOT,
    assert_one_line_error,
    command,
    copy_run,
    run_rows,
    run_script,
    script_env,
    small_disk,
    snapshot,
    write_config,
)
from transformer_jax.base import workdir as layout
from transformer_jax.base.lock import Owner, read_owner
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.data.tokenizer import train_tokenizer


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


@pytest.fixture(scope="module")
def setup(tmp_path_factory, trained_run):
    """A trained tiny run (checkpoints, tokenizer, config.json, logs), copies of it, and bad inputs next to it."""
    directory = tmp_path_factory.mktemp("bad_inputs")
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
    owned = directory / "owned"  # a run another live job (on another host) holds
    shutil.copytree(workdir, owned)
    (owned / layout.LOCK).write_text(json.dumps(dataclasses.asdict(
        dataclasses.replace(Owner.this_process(), host="another-host", pid=4242))))
    damaged = directory / "damaged_config"  # config.json cut short, as by a full disk
    shutil.copytree(workdir, damaged)
    (damaged / "config.json").write_text((workdir / "config.json").read_text()[:300])
    (directory / "damaged.json").write_text((workdir / "config.json").read_text()[:300])
    foreign = directory / "foreign_config"  # a config.json that is JSON but no run config
    shutil.copytree(workdir, foreign)
    (foreign / "config.json").write_text('{"model": {"layers": 2}}')
    (directory / "latin1.txt").write_bytes(b"The dog sleeps .\nDer Hund schl\xe4ft .\n")
    edited = directory / "edited_config"  # config.json with a value changed by hand to one no run can use
    shutil.copytree(workdir, edited)
    saved = json.loads((workdir / "config.json").read_text())
    saved["model"]["d_ff"] = -5
    (edited / "config.json").write_text(json.dumps(saved, indent=2))
    (directory / "edited.json").write_text(json.dumps(saved, indent=2))
    lacking = json.loads((workdir / "config.json").read_text())  # as from an older version: settings absent
    del lacking["training"]["warmup_steps"], lacking["model"]["dropout_rate"]
    (directory / "lacking.json").write_text(json.dumps(lacking, indent=2))
    corpora["dir_as_file"] = write_text_corpus(directory / "dir_as_file", train_en=None)
    (corpora["dir_as_file"] / "train.en").mkdir()
    corpora["pipe_as_file"] = write_text_corpus(directory / "pipe_as_file", train_en=None)
    os.mkfifo(corpora["pipe_as_file"] / "train.en")  # reading it would wait for a writer forever
    swapped = directory / "swapped_tokenizer"  # tokenizer.model of another corpus copied over the run's
    shutil.copytree(workdir, swapped)
    train_tokenizer([f"{word} sleeps ." for word in ("dog", "cat", "bird", "fish")] * 50,
                    str(swapped / "tokenizer.model"), vocab_size=300, model_type="bpe")
    return {"edited": edited, "swapped": swapped, "config": config, "workdir": workdir, "dir": directory, "owned": owned, "damaged": damaged,
            "foreign": foreign, **corpora}


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
     ["unknown data source 'nonsense'", "'builtin', 'tfds', 'text', 'tsv'"]),
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
     ["model.vocab_size=123 disagrees with the tokenizer's", "set model.vocab_size=0"]),
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
     ["edited.json holds a setting no run can use: d_ff=-5 must be a positive integer", "correct it in"]),
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
    ("no pair as short as max_length on a new workdir", fresh("--config.data.max_length=1"),
     ["no training pair fits max_length=1 tokens", "raise --config.data.max_length"]),
    ("batch smaller than one row on a new workdir", fresh("--config.data.tokens_per_batch=63"),
     ["data.tokens_per_batch=63 cannot hold one row of max_length=64"]),
    ("vocabulary larger than the corpus supports", fresh("--config.data.vocab_size=50000"),
     ["data.vocab_size=50000 is more than this corpus supports: SentencePiece built only",
      "set --config.data.vocab_size="]),
    ("data check failing on a new workdir", lambda s: [*text_source("mismatch")(s), f"--workdir={s['dir'] / 'fresh'}"],
     ["train.en has 3 lines but"]),
]


@pytest.fixture(scope="module")
def train_results(setup):
    """Every TRAIN_ROWS command (after --config and --workdir of the trained run), and the workdirs before and after."""
    workdirs = [setup["workdir"], setup["owned"]]
    before = [snapshot(w) for w in workdirs]
    rows = []
    for _, flags, _ in TRAIN_ROWS:
        row = flags(setup)  # a row's own --config replaces the tiny run's (two would both be loaded)
        config = [] if any(flag.startswith("--config=") for flag in row) else [f"--config={setup['config']}"]
        rows.append([*config, f"--workdir={setup['workdir']}", *row])
    results = run_rows("train.py", rows, setup["dir"])
    return dict(zip([row[0] for row in TRAIN_ROWS], results)), before, [snapshot(w) for w in workdirs]


@pytest.mark.parametrize("row", TRAIN_ROWS, ids=[row[0] for row in TRAIN_ROWS])
def test_train_py_rejects_bad_input_without_touching_the_workdir(setup, train_results, row):
    name, _, fragments = row
    results, before, after = train_results
    assert_one_line_error(results[name], *fragments)
    assert after == before  # the trained run and the owned one, byte for byte (the lock of the owned one too)
    assert not (setup["dir"] / "fresh").exists()
    assert "Traceback" not in results[name].stdout


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_a_coordinator_that_does_not_answer_ends_in_one_line_within_the_timeout(setup, script):
    """A closed local port as the coordinator of process 1: one line naming it after --cluster_timeout, not JAX's
    abort after 5 minutes."""
    from runs import free_port

    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_script(script, *([f"--config={setup['config']}"] if script == "train.py" else []),
                        f"--workdir={setup['workdir']}", "--multihost", f"--coordinator_address={address}",
                        "--num_processes=2", "--process_id=1", "--cluster_timeout=3")
    assert_one_line_error(result, f"no coordinator answered at --coordinator_address={address} within 3 s",
                          "--cluster_timeout")
    assert time.monotonic() - started < 60


def test_sigterm_while_waiting_for_the_coordinator_stops_at_once(setup):
    from runs import free_port, start_script

    process = start_script("train.py", f"--config={setup['config']}", f"--workdir={setup['dir'] / 'joining'}",
                           "--multihost", f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2",
                           "--process_id=1", "--cluster_timeout=600")
    time.sleep(15)  # past the imports, into the wait
    stopped = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - stopped < 10, stderr[-2000:]
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM: nothing; training had not started")


def test_a_coordinator_name_that_does_not_resolve_is_named(monkeypatch):
    """A stubbed resolver (tests reach no other host): the name is refused before any connection."""
    import socket

    from transformer_jax.cli.cluster import wait_for_coordinator
    from transformer_jax.errors import ConfigError

    def unresolved(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolved)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(ConfigError, match=r"coordinator.invalid' does not resolve \(Name or service not known\)"):
        wait_for_coordinator("coordinator.invalid:8476", timeout=1)


def test_get_config_returning_none_is_the_only_line(setup, train_results):
    """No warning of the config loader before the one line (it printed absl's WARNING and W-lines first)."""
    results, _, _ = train_results
    stderr = results["get_config() returning None"].stderr.strip()
    assert stderr.startswith("error: ") and len(stderr.splitlines()) == 1, stderr


def test_multihost_without_a_coordinator(setup):
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={setup['workdir']}", "--multihost")
    assert_one_line_error(result, "cannot join the multi-process run", "--coordinator_address=HOST:PORT")


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_jax_platforms_naming_a_platform_without_its_plugin(setup, script):
    # JAX_PLATFORMS is read when JAX starts its backends: a process of its own, not a row of run_rows.
    flags = [f"--config={setup['config']}"] if script == "train.py" else []
    before = snapshot(setup["workdir"])
    result = run_script(script, *flags, f"--workdir={setup['workdir']}", env=script_env(JAX_PLATFORMS="cuda"))
    assert_one_line_error(result, "JAX_PLATFORMS=cuda cannot start on this machine", "install the platform's JAX plugin",
                          "or unset JAX_PLATFORMS")
    assert snapshot(setup["workdir"]) == before


def test_no_libtpu_start_up_noise_on_a_host_without_tpu_chips(setup):
    import importlib.util

    assert importlib.util.find_spec("libtpu") is not None  # the test install has the tpu extra (the preflight's)
    env = script_env()
    del env["JAX_PLATFORMS"]  # as a user runs it: JAX picks the platforms
    result = run_script("eval.py", f"--workdir={setup['workdir']}", "--translate=-", "--mode=greedy",
                        stdin="The dog sleeps .\n", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.splitlines()) == 1
    for noise in ("TPU_WORKER_HOSTNAMES", "TPU accelerator type", "libtpu", "E0000"):
        assert noise not in result.stderr, result.stderr[-3000:]


def test_translate_reads_a_named_pipe_or_a_device_as_it_reads_a_file(setup, tmp_path):
    text = "The dog sleeps .\nThe cat eats .\n"
    (tmp_path / "in.txt").write_text(text)
    os.mkfifo(tmp_path / "in.fifo")  # as bash's --translate=<(command) gives it
    writer = threading.Thread(target=(tmp_path / "in.fifo").write_text, args=(text,), daemon=True)
    writer.start()
    rows = [[f"--workdir={setup['workdir']}", "--mode=greedy", f"--translate={path}"]
            for path in (tmp_path / "in.txt", tmp_path / "in.fifo", "/dev/null")]
    from_file, from_pipe, from_null = run_rows("eval.py", rows, tmp_path)
    assert from_file.returncode == 0 and len(from_file.stdout.splitlines()) == 2, from_file.stderr[-3000:]
    assert from_pipe.returncode == 0 and from_pipe.stdout == from_file.stdout, from_pipe.stderr[-3000:]
    assert from_null.returncode == 0 and from_null.stdout == "", from_null.stderr[-3000:]


def test_translate_to_an_output_that_cannot_hold_the_text_is_refused_before_any_work(setup, tmp_path):
    (tmp_path / "in.txt").write_text("The dog sleeps .\n")
    result = run_script("eval.py", f"--workdir={setup['workdir']}", f"--translate={tmp_path / 'in.txt'}",
                        env=script_env(PYTHONIOENCODING="ascii"))
    assert_one_line_error(result, "standard output's encoding is ascii, which cannot print every translation",
                          "set PYTHONIOENCODING=utf-8")
    assert result.stdout == ""


# (row, eval.py flags given the setup (after --workdir of a copy of the trained run), fragments of the error line)
EVAL_ROWS = [
    ("unknown checkpoint", lambda s: ["--checkpoint=bogus"], ["--checkpoint=bogus is not latest", "available steps: 4, 6"]),
    ("step not saved", lambda s: ["--checkpoint=999"], ["--checkpoint=999 is not", "available steps: 4, 6"]),
    ("average of none", lambda s: ["--checkpoint=average:0"], ["N must be a positive integer, e.g. average:5"]),
    ("average of text", lambda s: ["--checkpoint=average:x"], ["--checkpoint=average:x: N must be a positive"]),
    ("average of more than saved", lambda s: ["--checkpoint=average:9"], ["available steps:"]),
    ("unknown split", lambda s: ["--split=train"], ["--split=train: value should be one of <dev|test>"]),
    ("unknown mode", lambda s: ["--mode=topk"], ["--mode=topk: value should be one of <beam|greedy|sample>"]),
    ("zero beam", lambda s: ["--beam_size=0"], ["beam_size=0 must be a positive integer"]),
    ("infinite sampling temperature", lambda s: ["--mode=sample", "--temperature=inf"],
     ["temperature=inf must be a normal positive float32"]),
    ("temperature that is 0 in float32", lambda s: ["--mode=sample", "--temperature=1e-50"],
     ["temperature=1e-50 must be a normal positive float32 (1.2e-38 to 3.4e38"]),
    ("top_p that is 0 in float32", lambda s: ["--mode=sample", "--top_p=1e-50"],
     ["top_p=1e-50 must be in (0, 1] and not 0 in float32"]),
    ("length penalty beyond float32", lambda s: ["--alpha=1e39"], ["alpha=1e+39 must be >= 0 and finite in float32"]),
    ("sampling seed beyond 64 bits", lambda s: ["--mode=sample", "--seed=9223372036854775808"],
     ["seed=9223372036854775808 must be an integer in [0, 2**63 - 1]"]),
    ("unknown dtype", lambda s: ["--dtype=float16"], ["--dtype=float16: value should be one of <float32|bfloat16>"]),
    ("negative CPU device count", lambda s: ["--cpu_devices=-1"], ["cpu_devices=-1 must be >= 0 (0: one per core)"]),
    ("negative length penalty", lambda s: ["--alpha=-1"], ["alpha=-1.0 must be >= 0"]),
    ("negative length limit", lambda s: ["--max_extra_length=-1"], ["max_extra_length=-1 must be"]),
    ("negative top_k", lambda s: ["--mode=sample", "--top_k=-1"], ["top_k=-1 must be 0 (keep every token) or"]),
    ("zero temperature", lambda s: ["--mode=sample", "--temperature=0"],
     ["temperature=0.0 must be a normal positive float32", "mode=greedy takes the most likely token"]),
    ("negative temperature", lambda s: ["--mode=sample", "--temperature=-1"],
     ["temperature=-1.0 must be a normal positive float32"]),
    ("top_p above 1", lambda s: ["--mode=sample", "--top_p=2"], ["top_p=2.0 must be in (0, 1]"]),
    ("top_p of 0", lambda s: ["--mode=sample", "--top_p=0"], ["top_p=0.0 must be in (0, 1]"]),
    ("zero batch", lambda s: ["--batch_size=0"], ["batch_size=0 must be a positive integer"]),
    ("missing --translate file", lambda s: [f"--translate={s['dir'] / 'none.txt'}"],
     ["--input=", "none.txt does not exist", "pass a text file or - (standard input)"]),
    ("--translate file that is a directory", lambda s: [f"--translate={s['dir']}"],
     ["--input=", "is a directory; pass a text file or -"]),
    ("a stray word for the split", lambda s: ["dev"], ["unexpected argument 'dev'; pass it as --split=dev"]),
    ("a stray word beside --translate", lambda s: ["--translate=-", "in.txt"],  # --input given: not its value
     ["unexpected argument 'in.txt': this command takes flags only (see --help)"]),
    ("length limit beyond int32", lambda s: ["--max_extra_length=2147483648"],
     ["max_extra_length=2147483648 must be a positive integer, at most 2**30 = 1073741824"]),
    ("beam beyond int32", lambda s: ["--beam_size=2147483648"], ["beam_size=2147483648 must be", "at most 2**30"]),
    ("top_k beyond int32", lambda s: ["--mode=sample", "--top_k=2147483648"], ["top_k=2147483648 must be", "at most"]),
    ("batch beyond int32", lambda s: ["--batch_size=2147483648"], ["batch_size=2147483648 must be", "at most 2**30"]),
    ("token budget beyond int32", lambda s: ["--batch_tokens=2147483648"], ["batch_tokens=2147483648 must be"]),
    ("--translate file not UTF-8", lambda s: [f"--translate={s['dir'] / 'latin1.txt'}"],
     ["latin1.txt line 2 is not valid UTF-8 (byte 0xe4)", "re-encode the file as UTF-8"]),
    ("--write_averaged under a file", lambda s: [f"--write_averaged={s['dir'] / 'a_file' / 'avg'}"],
     ["cannot write", "a_file/avg (", "choose another path"]),
    ("--write_averaged onto an existing path", lambda s: [f"--write_averaged={s['dir'] / 'a_file'}"],
     ["a_file already exists", "choose another path"]),
    ("workdir missing", lambda s: [f"--workdir={s['dir'] / 'none'}"], ["none does not exist", "pass the --workdir"]),
    ("workdir that is a file", lambda s: [f"--workdir={s['dir'] / 'a_file'}"], ["a_file is a file, not a directory"]),
    ("empty workdir flag", lambda s: ["--workdir="], ["--workdir is empty", "the directory of a training run"]),
    ("workdir without a run", lambda s: [f"--workdir={s['dir']}"], ["holds no training run (no config.json"]),
    ("damaged config.json", lambda s: [f"--workdir={s['damaged']}"],
     ["damaged_config/config.json is damaged (Unterminated string starting at: line",
      "restore it, or run train.py on the workdir again"]),
    ("hand-edited config.json", lambda s: [f"--workdir={s['edited']}"],
     ["edited_config/config.json holds a setting no run can use: d_ff=-5", "correct it in"]),
    ("tokenizer of another corpus", lambda s: [f"--workdir={s['swapped']}"],
     ["swapped_tokenizer/tokenizer.model is not the tokenizer this run was trained with", "copy",
      "swapped_tokenizer/corpus/tokenizer.model to"]),
    ("sampling flag without sampling", lambda s: ["--top_k=5"],
     ["--top_k applies to --mode=sample, not --mode=beam", "pass --mode=sample"]),
    ("beam flag with greedy decoding", lambda s: ["--mode=greedy", "--beam_size=8"],
     ["--beam_size applies to --mode=beam, not --mode=greedy"]),
    ("infinite length penalty", lambda s: ["--alpha=inf"], ["alpha=inf must be >= 0 and finite"]),
    ("empty sentence to plot", lambda s: ["--plot_attention="], ["--plot_attention is empty"]),
    ("empty --write_averaged", lambda s: ["--write_averaged="], ["--write_averaged is empty"]),
    ("a split to score with a file to translate", lambda s: ["--split=dev", f"--translate={s['dir'] / 'a_file'}"],
     ["--split chooses the split to score, which --translate does not do; drop --split"]),
    ("two outputs at once", lambda s: [f"--write_averaged={s['dir'] / 'avg_new'}", f"--translate={s['dir'] / 'latin1.txt'}"],
     ["--translate and --write_averaged are two commands; run them one at a time"]),
    ("more CPU devices than XLA can gather", lambda s: ["--cpu_devices=1000"],
     ["cpu_devices=1000 is more than 64 CPU devices", "--cpu_devices=0 for one per core"]),
    ("config.json of something else", lambda s: [f"--workdir={s['foreign']}"],
     ["foreign_config/config.json is not a run config of this project (no 'data' section)", "restore it"]),
]


# (row, `transformer-jax` command line given the setup, fragments of the error line): each command's messages
# name its own flags (translate: --input, not eval.py's --translate).
COMMAND_ROWS = [
    ("translate: a stray word", lambda s: ["translate", f"--workdir={s['workdir']}", "in.txt"],
     ["unexpected argument 'in.txt'; pass it as --input=in.txt"]),
    ("translate: a missing input", lambda s: ["translate", f"--workdir={s['workdir']}", f"--input={s['dir'] / 'no'}"],
     ["--input=", "/no does not exist; pass a text file or - (standard input)"]),
    ("translate: a directory", lambda s: ["translate", f"--workdir={s['workdir']}", f"--input={s['dir']}"],
     ["is a directory; pass a text file or - (standard input)"]),
    ("translate: a length limit beyond int32",
     lambda s: ["translate", f"--workdir={s['workdir']}", f"--input={s['dir'] / 'latin1.txt'}",
                "--max_extra_length=2147483648"], ["max_extra_length=2147483648 must be a positive integer, at most"]),
    ("translate: a flag of another mode", lambda s: ["translate", f"--workdir={s['workdir']}", "--top_k=3"],
     ["--top_k applies to --mode=sample, not --mode=beam; drop it, or pass --mode=sample"]),
    ("score: a stray word", lambda s: ["score", f"--workdir={s['workdir']}", "dev"],
     ["unexpected argument 'dev'; pass it as --split=dev"]),
    ("score: a length limit beyond int32", lambda s: ["score", f"--workdir={s['workdir']}",
                                                      "--max_extra_length=2147483648"], ["at most 2**30 = 1073741824"]),
    ("score: a batch beyond int32", lambda s: ["score", f"--workdir={s['workdir']}", "--batch_size=2147483648"],
     ["batch_size=2147483648 must be a positive integer, at most 2**30"]),
]


def test_translate_and_score_refuse_with_their_own_flags_and_write_nothing(setup):
    before = snapshot(setup["workdir"])
    results = run_rows("transformer-jax", [flags(setup) for _, flags, _ in COMMAND_ROWS], setup["dir"])
    for (name, _, fragments), result in zip(COMMAND_ROWS, results):
        error = assert_one_line_error(result, *fragments)
        assert "--translate" not in error, name
        assert result.stdout == "", name  # nothing printed as if it were a translation or a score
    assert snapshot(setup["workdir"]) == before


@pytest.fixture(scope="module")
def eval_results(setup):
    """Every EVAL_ROWS command on a copy of the trained run (which is being owned by a job: eval.py takes no lock)."""
    workdir = setup["dir"] / "eval_run"
    shutil.copytree(setup["workdir"], workdir)
    watched = [workdir, setup["damaged"], setup["foreign"], setup["edited"], setup["swapped"]]
    before = [snapshot(w) for w in watched] + [(setup["dir"] / "a_file").read_text()]
    rows = [[f"--workdir={workdir}", *flags(setup)] for _, flags, _ in EVAL_ROWS]
    results = run_rows("eval.py", rows, setup["dir"])
    after = [snapshot(w) for w in watched] + [(setup["dir"] / "a_file").read_text()]
    return dict(zip([row[0] for row in EVAL_ROWS], results)), before, after


@pytest.mark.parametrize("row", EVAL_ROWS, ids=[row[0] for row in EVAL_ROWS])
def test_eval_py_rejects_bad_input_without_touching_the_run(eval_results, row):
    name, _, fragments = row
    results, before, after = eval_results
    assert_one_line_error(results[name], *fragments)
    assert after == before
    assert results[name].stdout == ""  # nothing printed as if it were a result


def test_ctrl_c_during_eval_py_says_what_was_finished_and_exits_130(setup):
    # The run is owned by a training job (its lock, as the owned copy has): eval.py reads it all the same.
    # A shell's background job (`pytest ... &`) ignores SIGINT and a child Python inherits that (it then
    # never raises KeyboardInterrupt): eval.py runs with Python's own Ctrl-C handler, as from a terminal.
    python, script, *args = command("eval.py", f"--workdir={setup['owned']}", "--translate=-", "--mode=greedy")
    with_ctrl_c = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                   "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    process = subprocess.Popen([python, "-c", with_ctrl_c, script, *args],
                               cwd=ROOT, env=script_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        process.stdin.write("The dog sleeps .\n")
        process.stdin.flush()
        first = process.stdout.readline()  # translated; eval.py now waits for the next line
        # Standard input stays open: eval.py can only end by the interrupt. Rarely (1 of 14 tries on
        # 2026-11-24, an interrupt sent the instant the translation was read) one is lost and eval.py
        # keeps waiting; a user presses Ctrl-C again, and so does this test, every 5 seconds.
        for _ in range(24):
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        rest, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert first.endswith("\n") and rest == ""  # one translation (a tiny model's may be empty), no more
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == "interrupted: 1 translations printed above; nothing else was written"
    assert read_owner(str(setup["owned"] / layout.LOCK)).pid == 4242  # the owner's lock left as it was


def test_sigterm_during_eval_py_says_what_was_finished_and_exits_143(setup):
    process = subprocess.Popen(command("eval.py", f"--workdir={setup['owned']}", "--translate=-", "--mode=greedy"),
                               cwd=ROOT, env=script_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        process.stdin.write("The dog sleeps .\n")
        process.stdin.flush()
        first = process.stdout.readline()  # translated; eval.py now waits for the next line
        process.send_signal(signal.SIGTERM)
        rest, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, stderr[-3000:]
    assert first.endswith("\n") and rest == ""
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == "stopped by SIGTERM: 1 translations printed above; nothing else was written"
    assert read_owner(str(setup["owned"] / layout.LOCK)).pid == 4242


def test_bfloat16_parameters_train_save_and_score_through_the_command_line(setup, tmp_path):
    # model.param_dtype=bfloat16 is documented; its compiled step failed (gradients promoted to float32).
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={tmp_path / 'run'}",
                        "--config.model.param_dtype=bfloat16", "--config.training.num_train_steps=2",
                        "--config.training.eval_every=0", "--config.training.checkpoint_every=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test SacreBLEU" in result.stdout
    params = Checkpointer(str(tmp_path / "run" / "checkpoints"), read_only=True).restore_params(2)
    assert {np.asarray(leaf).dtype.name for leaf in jax.tree.leaves(params)} == {"bfloat16"}


def test_a_run_trained_with_cudnn_attention_evaluates_on_a_cpu(setup, tmp_path):
    # A GPU run (model.attention_backend=cudnn) copied to a machine without cuDNN: eval.py decodes and
    # scores it with the same attention computed by XLA ("fused"), the parameters being the same.
    workdir = copy_run({"workdir": setup["workdir"]}, tmp_path / "run")
    saved = json.loads((workdir / "config.json").read_text())
    saved["model"]["attention_backend"] = "cudnn"
    (workdir / "config.json").write_text(json.dumps(saved))
    result = run_script("eval.py", f"--workdir={workdir}", "--mode=greedy", "--split=dev")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("dev (16 sentences") and "SacreBLEU" in result.stdout, result.stdout
    assert "perplexity" in result.stdout, result.stdout  # the dev loss, by the same attention


def test_a_reader_that_stops_reading_ends_eval_py_quietly(setup, tmp_path):
    # `eval.py --translate=FILE | head -1`: once the reader is gone, stop as Unix tools do (128 + SIGPIPE).
    (tmp_path / "many.txt").write_text("The dog sleeps .\n" * 40)
    process = subprocess.Popen(command("eval.py", f"--workdir={setup['workdir']}", f"--translate={tmp_path / 'many.txt'}",
                                       "--mode=greedy", "--batch_size=1"),
                               cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.readline()
    process.stdout.close()  # as `head -1` does after its line
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 141, stderr[-3000:]
    assert "Traceback" not in stderr and "error:" not in stderr, stderr[-3000:]


def test_closed_standard_output_is_refused_before_any_work(setup):
    # Scores or translations printed into a closed stdout would be lost without a word (exit 0).
    line = " ".join(command("eval.py", f"--workdir={setup['workdir']}")) + " >&-"
    done = subprocess.run(line, shell=True, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert_one_line_error(done, "standard output is closed", "redirect it to a file")
    assert not (setup["workdir"] / "eval").exists()


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=script_env(), capture_output=True,
                          text=True, timeout=300)


def test_preflight_given_a_workdir_that_is_not_there_creates_nothing(setup, tmp_path):
    """A mistyped --workdir must not become a run directory holding a tokenizer and a corpus."""
    for workdir in (tmp_path / "runs" / "bsae", tmp_path / "typo"):
        result = run_module("transformer_jax.aot", f"--config={setup['config']}", "--topology=v5e:2x4",
                            f"--workdir={workdir}")
        assert_one_line_error(result, f"--workdir={workdir} does not exist", f"mkdir -p {workdir}")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags, fragments", [
    (["--hf_dir=nowhere", "--workdir="], ["--workdir is empty", "the run directory to create"]),
    (["--hf_dir=nowhere", "--workdir= "], ["--workdir is empty"]),
    (["--hf_dir=nowhere", "--workdir=x", "--no_such_flag=1"], ["Unknown command line flag no_such_flag", "see --help"]),
])
def test_import_marian_errors_are_one_line(setup, tmp_path, flags, fragments):
    """The import's own checks and its flag parsing follow the commands' one-line convention (exit 2)."""
    result = subprocess.run([sys.executable, "-m", "transformer_jax.cli.import_marian", *flags], cwd=tmp_path,
                            env=script_env(), capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, *fragments)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("size,fault,remedy", [
    ("8k", "no space left on the device", "free space and run the same command again"),
    ("ro", "read-only file system", "writable and run the same command again"),
])
def test_prepare_onto_a_full_or_read_only_disk_names_the_fault_and_leaves_nothing(setup, tmp_path, size, fault, remedy):
    """The remedy follows the fault (errno), and a failed first preparation removes the directories it made."""
    with small_disk(tmp_path / "disk", "8k" if size == "ro" else size) as disk:
        if size == "ro":
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        result = run_module("transformer_jax.cli.prepare", f"--config={setup['config']}",
                            f"--output={disk / 'new' / 'corpus'}")
        left = os.listdir(disk)
    assert_one_line_error(result, fault, remedy)
    assert "free space" not in result.stderr or size != "ro"
    assert left == []


@pytest.mark.parametrize("flags, fragments", [
    (["--topology="], ["--topology is empty", "--topology=v5e:2x4"]),
    (["--topology=v5e:2x4", "--hbm_gb=0"], ["--hbm_gb=0.0 must be a positive number of GB per device"]),
])
def test_preflight_flags(setup, flags, fragments):
    assert_one_line_error(run_module("transformer_jax.aot", f"--config={setup['config']}", *flags), *fragments)


def test_prepare_into_an_empty_output(setup):
    assert_one_line_error(run_module("transformer_jax.cli.prepare", f"--config={setup['config']}", "--output="),
                          "--output is empty")


def test_a_workdir_on_a_read_only_file_system_says_so(setup, tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        result = run_script("train.py", f"--config={setup['config']}", f"--workdir={disk / 'run'}")
    assert_one_line_error(result, f"writing to the workdir {disk / 'run'}", "read-only file system",
                          "make", "writable or choose another --workdir")


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
    # Orbax abandons the other reads of the damaged files; they must not print tracebacks when collected.
    assert "Exception ignored" not in result.stderr, result.stderr[-3000:]
    assert_one_line_error(result, "checkpoints/6 cannot be read", "choose another with --checkpoint=STEP")
    assert snapshot(workdir) == before


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


def test_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(setup, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(setup["workdir"], workdir)
    checkpoints = snapshot(workdir / "checkpoints")
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={workdir}",
                        "--config.training.num_train_steps=12", "--config.training.learning_rate_scale=1e30",
                        "--config.training.max_skipped_updates=2")
    assert_one_line_error(result, "non-finite loss or gradient", "lower training.learning_rate_scale",
                          "(the last good checkpoint, step 6, is kept)")
    assert snapshot(workdir / "checkpoints") == checkpoints
    checkpointer = Checkpointer(str(workdir / "checkpoints"), read_only=True)
    params = checkpointer.restore_params(checkpointer.latest_step())
    assert checkpointer.latest_step() == 6
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("rate,advice", [
    ("--config.training.learning_rate_scale=1e30", "lower training.learning_rate_scale (it is 1e+30)"),
    ("--config.training.peak_learning_rate=1e9", "lower training.peak_learning_rate (it is 1e+09)"),
    ("--config.training.peak_learning_rate=1e30", "lower training.peak_learning_rate (it is 1e+30)"),
])
def test_non_finite_loss_before_any_checkpoint_names_the_rate_and_leaves_no_workdir(setup, tmp_path, rate, advice):
    """The advice names the learning-rate setting the run uses; a first start that saved nothing leaves nothing."""
    result = run_script("train.py", f"--config={setup['config']}", f"--workdir={tmp_path / 'new' / 'run'}",
                        "--config.training.num_train_steps=3", rate,
                        "--config.training.max_skipped_updates=2", "--config.training.eval_every=0")
    assert_one_line_error(result, "non-finite loss or gradient", "(no checkpoint was written)", advice)
    assert not (tmp_path / "new").exists()


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
