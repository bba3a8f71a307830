"""score, translate and eval.py given paths and text they cannot use, as a new user gives them: a folder no one may
write (`chattr +i`: EPERM), one this user may not write or a file it may not read (EACCES, run as `nobody`), a
directory where a file of results goes, a sentence of bytes that are not UTF-8, and eval.py's boolean flags spelt
as absl spells them or not.

Every row runs the real command line and expects exit status 2, exactly one `error: ...` line naming the path (or
the flag) and the fix, no traceback, and the run's files byte for byte as they were. Needs root (chattr, setpriv).
"""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from runs import ROOT, assert_one_line_error, command, copy_run, run_rows, script_env, snapshot
from transformer_jax.cli.old_forms import eval_command

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("chattr") or not shutil.which("setpriv"),
                               reason="needs root, chattr and setpriv")
NOBODY = 65534


@pytest.mark.parametrize("flag, command_, new", [
    ("--plot_curves=f", "score", []),
    ("--plot_curves=FALSE", "score", []),
    ("--plot_curves=0", "score", []),
    ("--plot_curves=T", "plot", ["--curves"]),
    ("--plot_curves=1", "plot", ["--curves"]),
    ("--plot_positional_encoding=True", "plot", ["--positional_encoding"]),
])
def test_eval_py_reads_a_boolean_as_absl_spells_it(capsys, flag, command_, new):
    """`--plot_curves=f` was read as true (only "false" and "0" were false)."""
    name, argv = eval_command(["eval.py", "--workdir=w", flag])
    assert (name, argv[1:]) == (command_, [*new, "--workdir=w"])


@pytest.mark.parametrize("flag, fragments", [
    ("--plot_curves=no", ["--plot_curves=no: 'no' is not a boolean", "pass --plot_curves (or --plot_curves=true) to "
                          "draw it, --noplot_curves (or --plot_curves=false) not to"]),
    ("--plot_curves=yes", ["'yes' is not a boolean"]),
    ("--plot_positional_encoding=", ["--plot_positional_encoding=: '' is not a boolean"]),
    ("--noplot_curves=true", ["--noplot_curves=true: --noplot_curves takes no value", "--plot_curves=false"]),
])
def test_eval_py_refuses_a_boolean_absl_would_refuse_in_one_line(capsys, flag, fragments):
    """`--plot_curves=no` drew the curves."""
    with pytest.raises(SystemExit) as exit_:
        eval_command(["eval.py", "--workdir=w", flag])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and error.startswith("error: ") and error.count("\n") == 1, error
    for fragment in fragments:
        assert fragment in error


def test_eval_py_plot_curves_no_is_refused_by_the_real_command(trained_run):
    before = snapshot(trained_run["workdir"])
    result = subprocess.run(command("eval.py", f"--workdir={trained_run['workdir']}", "--plot_curves=no"), cwd=ROOT,
                            env=script_env(), capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, "--plot_curves=no: 'no' is not a boolean")
    assert result.stdout == "" and snapshot(trained_run["workdir"]) == before


def test_a_sentence_of_bytes_that_are_not_utf8_is_one_line(trained_run):
    """Such bytes reach argv as lone surrogates, which SentencePiece refused with a RuntimeError traceback."""
    before = snapshot(trained_run["workdir"])
    for flags in ([b"--plot_attention=caf\xe9 au lait"],
                  [b"--plot_attention=the dog", b"--plot_attention_target=\xff"]):
        result = subprocess.run([*map(os.fsencode, command("eval.py", f"--workdir={trained_run['workdir']}")), *flags],
                                cwd=ROOT, env=script_env(), capture_output=True, timeout=300)
        result = subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                             result.stderr.decode(errors="replace"))
        name = "--attention_target" if len(flags) == 2 else "--attention"
        assert_one_line_error(result, f"{name} holds U+", "bytes that are not UTF-8, not text", "pass UTF-8 text")
    assert snapshot(trained_run["workdir"]) == before


def test_a_directory_where_the_scores_go_is_refused_before_any_work(trained_run, tmp_path):
    workdir = copy_run(trained_run, tmp_path / "run")
    (workdir / "eval" / "test.step_6.json").mkdir(parents=True)
    before = snapshot(workdir)
    result = subprocess.run(command("eval.py", f"--workdir={workdir}"), cwd=ROOT, env=script_env(),
                            capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, f"{workdir}/eval/test.step_6.json is a directory, where the translations and scores "
                                  "are written", "move it away and run the same command again")
    assert result.stdout == "" and snapshot(workdir) == before  # refused before translating: no score to lose


@pytest.fixture
def immutable(tmp_path):
    """chattr +i on the folders given (`lock(*paths)`), taken off again after the test."""
    locked = []

    def lock(*paths: pathlib.Path) -> None:
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
            subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
            locked.append(path)

    yield lock
    for path in locked:
        subprocess.run(["chattr", "-i", str(path)], check=True, capture_output=True)


# (row, eval.py flags given the run and a locked folder, fragments of the error line)
LOCKED_ROWS = [
    ("scores", lambda run, out: [f"--workdir={run}"],
     ["saving the translations and scores printed above", "/eval/test.step_6.hyp) failed: operation not permitted",
      "/eval writable and run the same command again"]),
    ("figure", lambda run, out: [f"--workdir={run}", "--plot_positional_encoding"],
     ["writing the figures", "plots/positional_encoding.png) failed: operation not permitted", "/plots writable"]),
    ("averaged parameters", lambda run, out: [f"--workdir={run}", f"--write_averaged={out / 'averaged'}"],
     ["writing the averaged parameters", "locked/averaged) failed: operation not permitted", "locked writable"]),
    ("export", lambda run, out: [f"--workdir={run}", f"--export=ctranslate2:{out / 'ct2'}"],
     ["writing the ctranslate2 model", "locked/ct2) failed: operation not permitted", "locked writable"]),
]


@ROOT_ONLY
def test_a_folder_no_one_may_write_is_one_line_naming_it(trained_run, tmp_path, immutable):
    workdir = copy_run(trained_run, tmp_path / "run")
    immutable(workdir / "eval", workdir / "plots", tmp_path / "locked")
    before = snapshot(tmp_path)
    results = run_rows("eval.py", [flags(workdir, tmp_path / "locked") for _, flags, _ in LOCKED_ROWS], tmp_path)
    for (name, _, fragments), result in zip(LOCKED_ROWS, results):
        assert_one_line_error(result, *fragments)
        assert ("SacreBLEU" in result.stdout) == (name == "scores")  # the scores are printed before their write
    assert {path: digest for path, digest in snapshot(tmp_path).items() if not path.startswith("eval.py.")} == before


@pytest.fixture
def as_nobody(trained_run):
    """(a copy of the trained run that user `nobody` may read but not write, the environment of its commands)."""
    place = pathlib.Path(tempfile.mkdtemp(prefix="as_nobody_"))
    try:
        place.chmod(0o755)
        workdir = copy_run(trained_run, place / "run")
        (workdir / "eval").mkdir(exist_ok=True)
        cache = place / "cache"
        cache.mkdir(mode=0o777)
        cache.chmod(0o777)
        yield workdir, script_env(JAX_COMPILATION_CACHE_DIR=str(cache), HOME=str(cache))
    finally:
        shutil.rmtree(place)


def run_as_nobody(env: dict, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run([*prefix, *command("eval.py", *args)], cwd=ROOT, env=env, input=stdin, capture_output=True,
                          text=True, timeout=300)


@ROOT_ONLY
def test_an_input_this_user_may_not_read_is_one_line_naming_it(as_nobody):
    workdir, env = as_nobody
    secret = workdir.parent / "secret.txt"
    secret.write_text("the dog sleeps .\n")
    secret.chmod(0o600)
    result = run_as_nobody(env, f"--workdir={workdir}", f"--translate={secret}")
    assert_one_line_error(result, f"--input={secret} cannot be read (Permission denied)",
                          "make it readable (chmod u+r) or pass another file")
    assert result.stdout == ""


@ROOT_ONLY
def test_a_folder_this_user_may_not_write_is_one_line_naming_it(as_nobody):
    workdir, env = as_nobody
    before = snapshot(workdir)
    result = run_as_nobody(env, f"--workdir={workdir}")
    assert_one_line_error(result, "saving the translations and scores printed above",
                          f"{workdir}/eval/test.step_6.hyp) failed: permission denied",
                          f"make {workdir}/eval writable and run the same command again")
    assert "SacreBLEU" in result.stdout and snapshot(workdir) == before
