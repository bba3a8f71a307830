"""The installed command, `transformer-jax COMMAND`: each command's --help lists its own flags and no other's, each
keeps the one-line error convention, packaged configs are found by name, and eval.py's old forms reach the new
commands (with a one-line note)."""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from runs import ROOT, assert_one_line_error, run_rows, script_env
from transformer_jax.__main__ import COMMANDS
from transformer_jax.cli.flag_parsing import packaged_config, packaged_config_names
from transformer_jax.cli.old_forms import eval_command

CLUSTER = {"multihost", "coordinator_address", "num_processes", "process_id", "compilation_cache", "cluster_timeout", "peer_timeout"}
RUN = {"workdir", "checkpoint"}
SEARCH = {"mode", "beam_size", "alpha", "max_extra_length", "seed", "temperature", "top_k", "top_p", "dtype"}
BATCHES = {"batch_size", "batch_tokens", "cpu_devices"}
OWN_FLAGS = {
    "train": {"config", "workdir", "config_help"} | CLUSTER,
    "prepare": {"config", "output", "workers", "config_help"},
    "preflight": {"config", "topology", "num_slices", "workdir", "hbm_gb", "search_width", "config_help"} | SEARCH
                 | {"batch_size", "batch_tokens"},
    "import": {"hf_dir", "workdir", "source_lang", "target_lang", "text_data"},
    "score": RUN | CLUSTER | SEARCH | BATCHES | {"split"},
    "translate": RUN | CLUSTER | SEARCH | BATCHES | {"input"},
    "translate-corpus": RUN | CLUSTER | SEARCH | BATCHES | {"input", "output_dir", "suffix", "shard_lines"},
    "average": RUN | CLUSTER | {"output"},
    "export": RUN | CLUSTER | {"format", "output"},
    "plot": RUN | SEARCH | {"curves", "positional_encoding", "attention", "attention_target"},
}


def program(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer_jax", *args], cwd=ROOT, capture_output=True, text=True,
                          env=script_env(), timeout=300)


def test_each_command_help_lists_its_own_flags_and_no_others(tmp_path):
    assert set(OWN_FLAGS) == set(COMMANDS)
    results = run_rows("transformer-jax", [[name, "--help"] for name in OWN_FLAGS], tmp_path)
    for name, result in zip(OWN_FLAGS, results):
        assert result.returncode == 0, result.stderr[-2000:]
        listed = set(re.findall(r"^  --(?:\[no\])?(\w+):", result.stdout, re.M))
        assert listed == OWN_FLAGS[name], f"{name}: extra {listed - OWN_FLAGS[name]}, missing {OWN_FLAGS[name] - listed}"
        assert result.stdout.startswith(f"transformer-jax {name} ")  # its usage line first


# (command line, fragments of its one error line): each command's own checks, before any work.
ROWS = [
    (["train", "--workdir=w", "--num_steps=3"], ["Unknown command line flag num_steps", "see --help"]),
    (["prepare", "--config=demo"], ["--output is required"]),
    (["preflight", "--config=demo", "--topology= "], ["--topology is empty"]),
    (["import", "--workdir=w", "--hf_dir=nowhere", "--split=test"], ["Unknown command line flag split"]),
    (["score"], ["--workdir is required"]),
    (["score", "--workdir=w", "--input=x"], ["Unknown command line flag input"]),
    (["translate", "--workdir=w", "--input= "], ["--input is empty"]),
    (["translate", "--workdir=w", "--split=dev"], ["Unknown command line flag split"]),
    (["average", "--workdir=w"], ["--output is required"]),
    (["average", "--workdir=w", "--output= "], ["--output is empty"]),
    (["export", "--workdir=w", "--format=onnx", "--output=o"], ["--format=onnx", "ctranslate2|hf"]),
    (["export", "--workdir=w", "--output=o"], ["--format is required"]),
    (["plot", "--workdir=w"], ["name the figures to draw"]),
    (["plot", "--workdir=w", "--attention_target=Haus"], ["--attention_target needs --attention"]),
    (["plot", "--workdir=w", "--multihost"], ["Unknown command line flag multihost"]),
    # A word that is no flag: refused, with the flag it was probably meant for (no command takes such words).
    (["translate", "--workdir=w", "in.txt"], ["unexpected argument 'in.txt'; pass it as --input=in.txt"]),
    (["translate", "--workdir=w", "-"], ["unexpected argument '-'; pass it as --input=-"]),
    (["score", "--workdir=w", "dev"], ["unexpected argument 'dev'; pass it as --split=dev"]),
    (["score", "--workdir=w", "greedy"], ["unexpected argument 'greedy'; pass it as --mode=greedy"]),
    (["score", "--workdir=w", "split=dev"], ["unexpected argument 'split=dev'; pass it as --split=dev"]),
    (["translate-corpus", "--workdir=w", "--input=a.txt", "b c.txt"],
     ["unexpected argument 'b c.txt'; pass it as '--input=b c.txt'"]),
    (["train", "--workdir=w", "--config=demo", "configs/smoke.py"],
     ["unexpected argument 'configs/smoke.py'; pass it as --config=configs/smoke.py"]),
    (["train", "--workdir=w", "--config=demo", "more"], ["unexpected argument 'more': this command takes flags only"]),
    (["average", "--workdir=w", "--output=o", "--", "x"], ["unexpected argument 'x': this command takes flags only"]),
    (["export", "--workdir=w", "--format=hf", "out"], ["--output is required"]),  # a missing flag is named first
    (["plot", "--workdir=w", "the dog"], ["unexpected argument 'the dog'; pass it as '--attention=the dog'"]),
    (["import", "--workdir=w", "--hf_dir=m", "extra"], ["unexpected argument 'extra': this command takes flags"]),
]


def test_each_command_keeps_the_one_line_error_convention(tmp_path):
    for (args, fragments), result in zip(ROWS, run_rows("transformer-jax", [args for args, _ in ROWS], tmp_path)):
        assert_one_line_error(result, *fragments)
        assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
        assert result.stdout == ""


def test_a_stray_word_is_refused_by_the_installed_command_before_reading_standard_input(tmp_path):
    """`translate --workdir=RUN in.txt` read standard input and translated it, as if in.txt were not there."""
    source = tmp_path / "in.txt"
    source.write_text("the dog\n")
    result = subprocess.run([sys.executable, "-m", "transformer_jax", "translate", f"--workdir={tmp_path / 'w'}",
                             str(source)], cwd=ROOT, input="the house\n", capture_output=True, text=True,
                            env=script_env(), timeout=300)
    assert_one_line_error(result, f"unexpected argument '{source}'; pass it as --input={source}")
    assert result.stdout == "" and sorted(path.name for path in tmp_path.iterdir()) == ["in.txt"]


def test_the_program_lists_its_commands_and_refuses_an_unknown_one():
    listed = program("--help")
    assert listed.returncode == 0
    assert re.findall(r"^  ([\w-]+) ", listed.stdout, re.M) == list(COMMANDS)
    bare = program()
    assert bare.returncode == 2 and "usage: transformer-jax COMMAND" in bare.stderr
    assert_one_line_error(program("evaluate", "--workdir=w"), "'evaluate' is not a transformer-jax command",
                          "score, translate")


def test_a_config_is_found_by_name_in_the_package_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    demo = packaged_config("demo")
    assert pathlib.Path(demo).read_text() == (ROOT / "configs" / "demo.py").read_text()
    assert packaged_config("configs/demo.py") == demo == packaged_config("demo.py")
    assert packaged_config("parallel_text:corpus,en,de") == packaged_config("parallel_text") + ":corpus,en,de"
    assert packaged_config("nope") == "nope" and packaged_config("other/demo.py") == "other/demo.py"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.py").write_text("# a user's own demo\n")
    assert packaged_config("configs/demo.py") == "configs/demo.py"  # a file that is here is the one meant
    assert {"demo", "smoke", "wmt14_ende_base", "wmt14_ende_big", "parallel_text", "rerun"} <= set(
        packaged_config_names())


@pytest.mark.parametrize("old, command, new", [
    (["--workdir=w", "--split=dev", "--beam_size=2"], "score", ["--workdir=w", "--split=dev", "--beam_size=2"]),
    (["--workdir=w", "--translate=in.txt", "--mode=greedy"], "translate", ["--input=in.txt", "--workdir=w",
                                                                           "--mode=greedy"]),
    (["--workdir=w", "--translate", "-"], "translate", ["--input=-", "--workdir=w"]),
    (["--workdir=w", "--write_averaged=avg"], "average", ["--output=avg", "--checkpoint=latest", "--workdir=w"]),
    (["--workdir=w", "--checkpoint=average:2", "--write_averaged=avg"], "average",
     ["--output=avg", "--workdir=w", "--checkpoint=average:2"]),
    (["--workdir=w", "--export=hf:out"], "export", ["--format=hf", "--output=out", "--workdir=w"]),
    (["--workdir=w", "--plot_curves", "--plot_attention=the dog", "--noplot_positional_encoding"], "plot",
     ["--attention=the dog", "--curves", "--workdir=w"]),
    (["--workdir=w", "--plot_curves=false"], "score", ["--workdir=w"]),
    (["--workdir=w", "--mode", "greedy", "--export=hf:out", "--dtype=bfloat16"], "export",
     ["--format=hf", "--output=out", "--workdir=w"]),
])
def test_eval_py_forms_of_old_reach_the_new_commands_with_a_note(capsys, old, command, new):
    name, argv = eval_command(["eval.py", *old])
    assert (name, argv[1:]) == (command, new)
    note = capsys.readouterr().err
    if command == "score":
        assert note == ""  # the same flags: nothing to say
    else:
        assert note.count("\n") == 1 and f"is `transformer-jax {command} " in note


@pytest.mark.parametrize("old, flags", [
    (["--workdir=w", "--plot_attention=the dog; echo pasted", "--plot_curves"],
     ["--plot_attention=the dog; echo pasted", "--plot_curves"]),
    (["--workdir=my runs/a", "--translate", "in file's.txt", "--mode=greedy"], ["--translate", "in file's.txt"]),
    (["--workdir=w", "--export=hf:out dir", "--batch_size", "8"], ["--export=hf:out dir"]),
    (["--workdir=w", "--write_averaged=$HOME/avg `date`"], ["--write_averaged=$HOME/avg `date`"]),
])
def test_eval_py_notes_the_new_form_quoted_as_one_command_to_paste(capsys, old, flags):
    """The note's command, split as a POSIX shell splits it, is the argv eval.py runs: no word is split or lost
    (unquoted, `--attention=the dog; echo pasted` ran `echo` and plotted "the")."""
    name, argv = eval_command(["eval.py", *old])
    note = capsys.readouterr().err
    written, command = note.removeprefix("note: eval.py ").split(" is `", 1)
    assert shlex.split(command.rsplit("` now", 1)[0]) == ["transformer-jax", name, *argv[1:]]
    assert shlex.split(written) == flags  # the old flags, as given


@pytest.mark.parametrize("old, fragment", [
    (["--translate=a", "--export=hf:o"], "--translate and --export are two commands"),
    (["--export=ctranslate2"], "--export=ctranslate2 is not FORMAT:DIR"),
    (["--write_averaged= "], "--write_averaged is empty"),
    (["--plot_curves", "--split=dev"], "--split chooses the split to score, which --plot_curves does not do"),
    (["--translate"], "--translate needs a value"),
])
def test_eval_py_forms_that_never_worked_stay_one_line_errors(capsys, old, fragment):
    with pytest.raises(SystemExit) as exit_:
        eval_command(["eval.py", "--workdir=w", *old])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and fragment in error


def test_eval_py_and_the_command_translate_alike(trained_run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the dog\nthe house\n")
    env = script_env()
    old = subprocess.run([sys.executable, "eval.py", f"--workdir={trained_run['workdir']}", f"--translate={source}"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    new = subprocess.run([sys.executable, "-m", "transformer_jax", "translate", f"--workdir={trained_run['workdir']}"],
                         cwd=tmp_path, input=source.read_text(), capture_output=True, text=True, env=env, timeout=300)
    assert old.returncode == new.returncode == 0, old.stderr[-2000:] + new.stderr[-2000:]
    assert old.stdout == new.stdout and len(new.stdout.splitlines()) == 2
    new_form = shlex.join(["transformer-jax", "translate", f"--input={source}", f"--workdir={trained_run['workdir']}"])
    assert f"eval.py --translate={source} is `{new_form}` now" in old.stderr
