"""train.py checks its config once, at start-up: a refused value is one line naming the key and its `--config.` flag,
before any data is read, any tokenizer trained or anything written; and the check runs once before the first
update (each setting, then the settings together), not again when the run is assembled."""

import json
import subprocess
import sys

from runs import ROOT, assert_one_line_error, run_rows, script_env, write_config

# train.py with the config checks counted; the count is printed where the run would first read its data, and the run
# stops there (exit 0): the checks that ran before any data, and how often.
COUNTED_TRAIN = r"""
import json, sys
import transformer_jax.config as config_api
from transformer_jax.config import schema
from transformer_jax.run import assembly

calls = []

def counted(name, check):
    def wrapper(config):
        calls.append(name)
        return check(config)
    return wrapper

for name in ("check_run_config", "check_settings", "check_combination"):
    wrapped = counted(name, getattr(schema, name))
    setattr(schema, name, wrapped)
    setattr(config_api, name, wrapped)
assembly.check_run_config = schema.check_run_config

def first_data(*args, **kwargs):
    print("checks: " + json.dumps(calls), flush=True)
    raise SystemExit(0)

assembly.prepare_data = first_data
from transformer_jax.__main__ import run_subcommand
run_subcommand("train", ["train.py", *sys.argv[1:]])
"""


def test_the_issue_s_three_refusals_name_the_key_at_start_up_and_write_nothing(tmp_path):
    config, workdir = write_config(tmp_path), tmp_path / "run"
    rows = [
        ("--config.data.source=txt", "data.source='txt' is not one of ['builtin', 'tfds', 'text', 'tsv']",
         "set --config.data.source to one of them"),
        ("--config.data.tokenizer_type=word", "data.tokenizer_type='word' is not one of ['unigram', 'bpe']",
         "set --config.data.tokenizer_type to one of them"),
        ("--config.model.dropout_rate=1.5", "model.dropout_rate=1.5 must be in [0, 1)",
         "set --config.model.dropout_rate to a value in that range"),
    ]
    results = run_rows("train.py", [[f"--config={config}", f"--workdir={workdir}", flag] for flag, *_ in rows],
                       tmp_path)
    for (_, problem, fix), result in zip(rows, results):
        line = assert_one_line_error(result, problem, fix)
        assert result.stderr.strip() == line, result.stderr  # the one line, and nothing else
        assert not workdir.exists()  # no corpus read or prepared, no tokenizer trained, nothing written


def test_the_config_is_checked_once_before_the_first_update(tmp_path):
    config = write_config(tmp_path)
    done = subprocess.run([sys.executable, "-c", COUNTED_TRAIN, f"--config={config}",
                           f"--workdir={tmp_path / 'run'}"], cwd=ROOT, env=script_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    counted = [line for line in done.stdout.splitlines() if line.startswith("checks: ")]
    assert counted and json.loads(counted[0].removeprefix("checks: ")) == ["check_settings", "check_combination"]
