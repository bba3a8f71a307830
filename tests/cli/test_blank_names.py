"""A blank name (`--workdir=`, `--output=' '`, `--config.data.prepared=' '`) is refused in one line saying the flag is
empty and what to pass (commands.refuse_blank, config PATH_SETTINGS), never quoted as '' nor made into a path of spaces.

Each command's rows run through its own flag parsing and main (tests/cli_rows.py), in one process a command.
"""

import pytest

from runs import ROOT, assert_one_line_error, run_rows, write_config

BLANKS = ("", " ")
SMOKE = str(ROOT / "configs" / "smoke.py")

# command -> [(flags before the blank one, the blank flag, the words after "--NAME is empty; pass")]
ROWS = {
    "train": [([f"--config={SMOKE}"], "workdir", "the directory for the run's checkpoints and logs")],
    "prepare": [([f"--config={SMOKE}"], "output", "the directory to prepare the corpus into")],
    "preflight": [([f"--config={SMOKE}", "--topology=v5e:2x2"], "workdir", "the run directory whose corpus")],
    "score": [([], "workdir", "the directory of a training run")],
    "translate": [([], "workdir", "the directory of a training run"),
                  (["--workdir={run}"], "input", "the file to translate, or - for standard input")],
    "translate-corpus": [(["--input=a.txt"], "workdir", "the directory of a training run"),
                         (["--workdir={run}"], "input", "the files (or globs) to translate"),
                         (["--workdir={run}", "--input=a.txt"], "output_dir", "a directory, or leave it out")],
    "average": [(["--output={out}"], "workdir", "the directory of a training run"),
                (["--workdir={run}"], "output", "the path to write the parameters to")],
    "export": [(["--format=ctranslate2", "--output={out}"], "workdir", "the directory of a training run"),
               (["--format=ctranslate2", "--workdir={run}"], "output", "the directory to write the model to")],
    "plot": [(["--curves"], "workdir", "the directory of a training run")],
    "import": [(["--workdir={new}"], "hf_dir", "a local Hugging Face Marian model directory"),
               (["--hf_dir={hf}"], "workdir", "the run directory to create")],
}


@pytest.mark.parametrize("command", list(ROWS))
def test_a_blank_path_flag_is_named_empty_with_what_to_pass(tmp_path, command):
    names = {name: str(tmp_path / name) for name in ("run", "out", "new", "hf")}
    rows, expected = [], []
    for before, flag, needed in ROWS[command]:
        for blank in BLANKS:
            rows.append([*(arg.format(**names) for arg in before), f"--{flag}={blank}"])
            expected.append((flag, needed))
    for result, (flag, needed) in zip(run_rows(command, rows, tmp_path), expected):
        line = assert_one_line_error(result, f"--{flag} is empty; pass {needed}")
        assert "''" not in line and "' '" not in line
    assert not (ROOT / " ").exists() and not any(path.name.strip() == "" for path in tmp_path.iterdir())


def test_a_blank_path_setting_of_the_config_is_named(tmp_path):
    keys = ["data.prepared", "data.path", "training.init_from"]
    config, workdir = write_config(tmp_path), tmp_path / "run"
    results = run_rows("train.py", [[f"--config={config}", f"--workdir={workdir}", f"--config.{key}= "] for key in keys],
                       tmp_path)
    for key, result in zip(keys, results):
        line = assert_one_line_error(result, f"{key} is blank (only spaces); pass", "or leave the setting out")
        assert "''" not in line
    assert not workdir.exists()
