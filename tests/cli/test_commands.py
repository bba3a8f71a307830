"""train.py and eval.py as a user runs them: outputs, preemption, checkpoint choice, translation, errors.

The eval.py command lines on the shared trained run whose checks read only their output and files (scores, an
average, an export, errors, translations of standard input and of a file) run in one process
(tests/cli_rows.py, as runs.run_rows runs it: eval.py's own flag parsing and main, one command line after another, the
process's standard input given), as do train.py's refusals of a bad config, and the same commands that resume the runs
stopped below; the rest start their own processes (other device counts, signals).
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from runs import CPU_COMPILE_FLAGS, assert_one_line_error, command, copy_run, run_rows, script_env, write_config
from transformer_jax.checkpoints.manager import Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(script_trained_run, tmp_path_factory):
    """This module's copy of the tiny run trained by train.py (6 steps, checkpoints at 2, 4 (dropped), 6 (+ best)),
    and what train.py printed."""
    workdir = copy_run(script_trained_run, tmp_path_factory.mktemp("run") / "workdir")
    printed = subprocess.CompletedProcess([], 0, script_trained_run["stdout"], script_trained_run["stderr"])
    return script_trained_run["config"], workdir, printed


def rows_in_one_process(script: str, rows: dict[str, list[str]], directory: pathlib.Path, stdin: str = "",
                        env: dict[str, str] | None = None) -> dict[str, subprocess.CompletedProcess]:
    """{name: result} of each command line of `rows` through `script`'s flag parsing and main, all in one process
    (tests/cli_rows.py, as runs.run_rows runs it) whose standard input is `stdin`, in `env` (runs.script_env())."""
    rows_file, out = directory / f"{script}.rows.json", directory / f"{script}.results.json"
    rows_file.write_text(json.dumps(list(rows.values())))
    done = subprocess.run(command("tests/cli_rows.py", script, rows_file, out), cwd=ROOT, env=env or script_env(),
                          input=stdin, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: subprocess.CompletedProcess(args, r["returncode"], r["stdout"], r["stderr"])
            for (name, args), r in zip(rows.items(), json.loads(out.read_text()))}


STANDARD_INPUT = "The dog sleeps.\n\nI see the cat.\n"


@pytest.fixture(scope="module")
def evaluations(trained, tmp_path_factory):
    """{name: result} of the eval.py command lines below on the module's run (and on broken copies of it), all in one
    process (standard input: STANDARD_INPUT), in this order; "directory": where the copies and outputs were made."""
    _, workdir, _ = trained
    directory = tmp_path_factory.mktemp("evaluations")
    (directory / "standard_input.txt").write_text(STANDARD_INPUT)
    (directory / "not_a_run").mkdir()
    empty = directory / "empty_run"
    empty.mkdir()
    for name in ("config.json", "tokenizer.model"):
        shutil.copy(workdir / name, empty / name)
    mismatched = directory / "mismatched"
    shutil.copytree(workdir, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    config["model"]["d_ff"] = 128
    (mismatched / "config.json").write_text(json.dumps(config))
    rows = {
        "standard input": [f"--workdir={workdir}", "--translate=-", "--mode=greedy"],
        "bfloat16": [f"--workdir={workdir}", f"--translate={directory / 'standard_input.txt'}", "--mode=greedy",
                     "--dtype=bfloat16"],
        "latest": [f"--workdir={workdir}", "--checkpoint=latest", "--beam_size=2"],
        "average:2": [f"--workdir={workdir}", "--checkpoint=average:2", f"--write_averaged={directory / 'averaged'}"],
        "export": [f"--workdir={workdir}", f"--export=ctranslate2:{directory / 'ct2'}"],
        "export again": [f"--workdir={workdir}", f"--export=ctranslate2:{directory / 'ct2'}"],
        "average": [f"--workdir={workdir}", "--checkpoint=average", "--split=dev", "--mode=greedy"],
        "missing workdir": [f"--workdir={directory / 'missing'}"],
        "no config.json": [f"--workdir={directory / 'not_a_run'}"],
        "average:9": [f"--workdir={workdir}", "--checkpoint=average:9"],
        "no checkpoint": [f"--workdir={empty}"],
        "mismatched": [f"--workdir={mismatched}"],
    }
    mismatched_hyp = (mismatched / "test_final.hyp").read_text()
    results = rows_in_one_process("eval.py", rows, directory, stdin=STANDARD_INPUT)
    return {**results, "directory": directory, "mismatched_hyp_before": mismatched_hyp}


def test_train_prints_sacrebleu_with_signature_and_writes_outputs(trained):
    _, workdir, result = trained
    assert "test SacreBLEU" in result.stdout and "nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    final = json.loads((workdir / "test_final.json").read_text())
    assert final["step"] == 6 and 0.0 <= final["bleu"] <= 100.0
    hypotheses = (workdir / "test_final.hyp").read_text().splitlines()
    assert len(hypotheses) == 16  # every test sentence, in order
    assert (workdir / "tokenizer.model").exists() and (workdir / "config.json").exists()


def test_eval_latest_and_average_write_results_next_to_the_run(trained, evaluations):
    _, workdir, _ = trained
    latest = evaluations["latest"]
    assert latest.returncode == 0, latest.stderr[-3000:]
    assert "SacreBLEU" in latest.stdout and "paper-style; not comparable" in latest.stdout
    results = json.loads((workdir / "eval" / "test.step_6.json").read_text())
    assert results["steps"] == [6] and results["sentences"] == 16 and np.isfinite(results["perplexity"])
    assert len((workdir / "eval" / "test.step_6.hyp").read_text().splitlines()) == 16

    steps = Checkpointer(str(workdir / "checkpoints"), asynchronous=False).steps()
    averaged = evaluations["directory"] / "averaged"
    result = evaluations["average:2"]  # --checkpoint=average:2 --write_averaged=averaged
    assert result.returncode == 0, result.stderr[-3000:]
    import orbax.checkpoint as ocp

    written = ocp.StandardCheckpointer().restore(str(averaged))
    checkpointer = Checkpointer(str(workdir / "checkpoints"), asynchronous=False)
    last_two = [checkpointer.restore_params(step) for step in steps[-2:]]
    expected = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / 2, *last_two)
    for got, want in zip(jax.tree.leaves(written), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_eval_translates_standard_input_line_by_line(evaluations):
    result = evaluations["standard input"]  # --translate=- --mode=greedy, STANDARD_INPUT on the process's stdin
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # empty input line -> empty output
    # Decoding in bfloat16 (weights cast once), the same lines read from a file: the same translations.
    bfloat16 = evaluations["bfloat16"]
    assert bfloat16.returncode == 0, bfloat16.stderr[-3000:]
    assert bfloat16.stdout == result.stdout


def test_eval_splits_a_files_batches_over_cpu_devices_with_the_same_translations(trained, tmp_path):
    _, workdir, _ = trained
    text = tmp_path / "lines.txt"
    text.write_text("The dog sleeps.\nI see the cat.\n\nThe cat sees the big dog.\nA bird.\n")
    # Without a device count in the environment, so that the default is one device per core.
    env = {key: value for key, value in os.environ.items() if key != "JAX_NUM_CPU_DEVICES"}
    env["XLA_FLAGS"] = CPU_COMPILE_FLAGS
    cores = min(len(os.sched_getaffinity(0)), 8)
    outputs = {}
    for devices, expected in (("1", 1), ("3", 3), (None, cores)):
        result = subprocess.run(
            [sys.executable, str(ROOT / "eval.py"), f"--workdir={workdir}", f"--translate={text}", "--beam_size=2",
             "--verbosity=0", *([f"--cpu_devices={devices}"] if devices else [])],
            cwd=ROOT, env=dict(env, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        # The rows really were split: 4 sentences (the empty line is not decoded), one batch, `expected` devices.
        assert f"translating 4 sentences in 1 batches on {expected} device(s)" in result.stderr, result.stderr[-3000:]
        outputs[devices] = result.stdout
    assert len(outputs["1"].split("\n")) == 6 and outputs["1"].split("\n")[2] == ""
    assert outputs["3"] == outputs["1"] and outputs[None] == outputs["1"]


def test_eval_exports_a_ctranslate2_model_that_scores_as_ours(trained, evaluations):
    ctranslate2 = pytest.importorskip("ctranslate2")
    import sentencepiece as spm

    from transformer_jax import Transformer
    from transformer_jax.checkpoints.saved_run import open_run
    from transformer_jax.checkpoints.selection import checkpoint_params, select_steps

    _, workdir, _ = trained
    out = evaluations["directory"] / "ct2"
    result = evaluations["export"]  # --export=ctranslate2:out
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"model to {out}" in result.stdout
    translator = ctranslate2.Translator(str(out), device="cpu")
    pieces = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    source, target = pieces.encode(["the dog sleeps .", "I see the cat ."], out_type=str)
    ct2_log_probs = translator.score_batch([source], [target])[0].log_probs  # target tokens, then EOS

    loaded = open_run(str(workdir))
    params = checkpoint_params(loaded, select_steps(loaded.checkpointer, "latest"))
    loaded.checkpointer.close()
    src = np.array([pieces.piece_to_id(source) + [pieces.eos_id()]])
    tgt = np.array(pieces.piece_to_id(target) + [pieces.eos_id()])
    tgt_in = np.r_[pieces.bos_id(), tgt[:-1]][None]
    logits = np.array(Transformer(loaded.model_config).apply({"params": params}, src, tgt_in))
    logits[..., [pieces.pad_id(), pieces.bos_id()]] = -np.inf  # never emitted by our decoding
    ours = np.asarray(jax.nn.log_softmax(logits[0]))[np.arange(len(tgt)), tgt]
    np.testing.assert_allclose(ct2_log_probs, ours, atol=1e-4)

    again = evaluations["export again"]  # the same command line, after it
    assert_one_line_error(again, "not empty")


def test_eval_errors_name_the_problem_and_what_exists(evaluations):
    assert_one_line_error(evaluations["missing workdir"], "does not exist")
    assert_one_line_error(evaluations["no config.json"], "no config.json")
    assert_one_line_error(evaluations["average:9"], "available steps:")
    assert_one_line_error(evaluations["no checkpoint"], "no checkpoint in")  # config.json and tokenizer alone
    # config.json's model.d_ff changed to 128: the checkpoint's parameters do not fit, and nothing is overwritten.
    assert_one_line_error(evaluations["mismatched"], "does not match the config", "(128,) in the model")
    mismatched = evaluations["directory"] / "mismatched"
    assert (mismatched / "test_final.hyp").read_text() == evaluations["mismatched_hyp_before"]


def test_bad_config_fails_at_start_with_one_line(tmp_path):
    """Each command line through train.py's flag parsing and main, all in one process (runs.run_rows)."""
    config = write_config(tmp_path)
    workdir = tmp_path / "workdir"
    typo, indivisible, missing, unknown = run_rows("train.py", [
        [f"--config={config}", f"--workdir={workdir}", "--config.model.num_hedas=2"],
        [f"--config={config}", f"--workdir={workdir}", "--config.model.num_heads=3"],
        [f"--config={tmp_path / 'none.py'}", f"--workdir={workdir}"],
        ["--config=demo2", f"--workdir={workdir}"],
    ], tmp_path)
    assert_one_line_error(typo, "did you mean --config.model.num_heads=2?")
    assert_one_line_error(indivisible, "not divisible by num_heads=3")
    assert_one_line_error(missing, "none.py: no such file; pass the path of a config file")
    assert_one_line_error(unknown, "no config of that name ships with the package", "demo, ")


def test_a_log_file_gets_plain_lines_not_a_carriage_return_bar(script_trained_run):
    """Standard error redirected (nohup ... > train.log): one line per log window, no carriage return (the shared
    run's train.py wrote its standard error to a file)."""
    text = script_trained_run["stderr"]
    assert "\r" not in text
    lines = [line for line in text.splitlines() if line.startswith("train step ")]
    assert [line.split()[2] for line in lines] == [f"{step}/6" for step in range(1, 7)], lines  # log_every=1
    assert all(" | loss " in line and " | tok_s " in line and " | ETA " in line for line in lines)


@pytest.fixture(scope="module")
def stopped_runs(tmp_path_factory):
    """Two train.py runs stopped by SIGTERM, each in its process, then the same commands that resume or rerun them in
    one (runs.run_rows): {"in the loop": (the stop's returncode, stdout, stderr, the checkpoint saved, the last
    logged step, the resume), "preparing": (the stopped process's returncode and stderr, what it left, the rerun)}."""
    from runs import NO_TEST_TRANSLATION, start_script
    from transformer_jax.base import workdir as layout

    directory = tmp_path_factory.mktemp("stopped_runs")
    config = write_config(directory)

    # In the training loop, once 3 steps are logged. The command ends without the test translation (nothing below
    # reads one): the stop and the resume are the same command.
    workdir = directory / "in_the_loop"
    args = [f"--config={config}", f"--workdir={workdir}", "--config.training.checkpoint_every=1000",
            NO_TEST_TRANSLATION]
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args,
                                "--config.training.num_train_steps=100000"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=240)
    saved = Checkpointer(str(workdir / "checkpoints"), asynchronous=False).latest_step()
    logged = max(json.loads(line)["step"] for line in metrics.read_text().splitlines())
    in_the_loop = (process.returncode, stdout, stderr, saved, logged)
    resume = [*args, f"--config.training.num_train_steps={(saved or 0) + 2}"]

    # While preparing the data: as the corpus is being written (tests/signal_at.py), with the lock taken. A signal
    # sent from here once the lock exists could land after the preparation on a loaded machine.
    prepared = directory / "preparing"
    process = start_script("tests/signal_at.py", f"--config={config}", f"--workdir={prepared}",
                           env=script_env(SIGNAL_AT="preparation"))
    _, stderr = process.communicate(timeout=300)
    left = {"lock": (prepared / layout.LOCK).exists(), "half written": list(prepared.glob("**/*.new.*")),
            "checkpoints": (prepared / layout.CHECKPOINTS).exists()}
    preparing = (process.returncode, stderr, left)

    resumed, rerun = run_rows("train.py", [resume, [f"--config={config}", f"--workdir={prepared}"]], directory)
    return {"in the loop": (*in_the_loop, resumed), "preparing": (*preparing, rerun), "loop workdir": workdir}


def test_sigterm_saves_a_checkpoint_and_the_run_resumes(stopped_runs):
    returncode, stdout, stderr, saved, logged, resumed = stopped_runs["in the loop"]
    assert returncode == 143, stderr[-3000:]  # stopped before its last step: a scheduler restarts it
    stop = re.search(r"stopped by signal 15 at step (\d+): checkpoint (\d+) saved [\d.]+ s after the signal, which "
                     r"arrived at step \d+(; its dev evaluation .*)?; the same command resumes the run", stdout)
    assert stop and stop.group(1) == stop.group(2), stdout[-3000:]
    assert saved == int(stop.group(2))
    assert saved is not None and saved >= logged >= 3
    # The same command, to step saved + 2.
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = stopped_runs["loop workdir"] / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == list(range(1, saved + 3))


def test_eval_checkpoint_average_uses_the_runs_average_last(trained, evaluations):
    """`--checkpoint=average` averages the run's eval.average_last (2 in the smoke config), not a default 5."""
    _, workdir, _ = trained
    assert json.loads((workdir / "config.json").read_text())["eval"]["average_last"] == 2
    result = evaluations["average"]  # --checkpoint=average --split=dev --mode=greedy
    assert result.returncode == 0, result.stderr[-3000:]
    steps = Checkpointer(str(workdir / "checkpoints"), asynchronous=False).steps()
    results = json.loads((workdir / "eval" / f"dev.average_2_to_{steps[-1]}.json").read_text())
    assert results["steps"] == steps[-2:] and results["checkpoint"] == "average"


def test_hosts_with_equal_pids_write_under_distinct_temporary_names(tmp_path, monkeypatch):
    """Hosts sharing a workdir (NFS, a bucket) may run processes with equal pids: the workdir probe and
    write_atomically's temporary file carry the hostname too (and a random suffix), and still leave
    nothing behind."""
    import os
    import socket

    from transformer_jax.base import files
    from transformer_jax.cli import run_directory

    monkeypatch.setattr(os, "getpid", lambda: 1)
    removed, replaced, real_remove, real_replace = [], [], os.remove, os.replace
    monkeypatch.setattr(os, "remove", lambda path: (removed.append(path), real_remove(path))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append(src), real_replace(src, dst))[1])
    target = tmp_path / "config.json"
    target.write_text("old")
    for host in ("host-a", "host-b"):
        monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
        run_directory.ensure_writable_workdir(str(tmp_path))
        files.write_atomically(str(target), f"written by {host}")
    assert len(set(removed)) == len(set(replaced)) == 2
    assert all(".host-a.1." in a and ".host-b.1." in b for a, b in (removed, replaced))
    assert target.read_text() == "written by host-b" and os.listdir(tmp_path) == ["config.json"]
    # Two writers in one process still differ (the random suffix), and the JAX process index joins in.
    assert files.unique_name("x") != files.unique_name("x")
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(jax, "process_index", lambda: 3)
    assert files.process_tag() == "host-b.1.p3"


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import os

    from transformer_jax.base import files

    target = tmp_path / "metrics.jsonl"
    target.write_bytes(b"old")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomically(str(target), b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["metrics.jsonl"]


def test_resuming_with_another_device_count_or_batch_size_is_one_error_and_changes_nothing(tmp_path):
    """The data position of a checkpoint is an index into epochs planned for its batch shapes (rows are a
    multiple of the device count): a run that would plan other batches stops instead of shifting.

    The runs end without the test translation (eval.test_at_end=False): they say so, and write no test output and no
    plot; the same command with it on, once the run has finished, translates and scores the test split."""
    from runs import NO_TEST_TRANSLATION, run_script, script_env, snapshot

    config = write_config(tmp_path)
    workdir = tmp_path / "workdir"
    # Rows of 64 tokens (max_length), so the batch shapes below are stated; a width change is its own error.
    args = [f"--config={config}", f"--workdir={workdir}", "--config.training.eval_every=0",
            "--config.data.row_width=64", NO_TEST_TRANSLATION]
    batch = "--config.data.tokens_per_batch=576"  # 9 rows of 64 tokens; 8 rows on 2 devices
    first = run_script("train.py", *args, batch, "--config.training.num_train_steps=2", env=script_env(2))
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.strip().splitlines()[-1] == (
        f"training finished at step 2; no test translation (eval.test_at_end=False): transformer-jax score "
        f"--workdir={workdir} scores the test split, transformer-jax plot --workdir={workdir} --curves draws the "
        "learning curves"), first.stdout
    assert "SacreBLEU" not in first.stdout
    assert not list(workdir.glob("test_final*")) and not (workdir / "plots").exists()
    before = snapshot(workdir)
    longer = "--config.training.num_train_steps=4"
    assert_one_line_error(run_script("train.py", *args, batch, longer, env=script_env(1)),
                          "batches are 8x64", "would be 9x64 (devices 2 -> 1)", "start a new workdir")
    # On 2 devices, in one process: another batch size on the run, then the same command as the first resuming a copy
    # of the run (made now: the snapshot below shows that neither refusal changed the run).
    resuming = copy_run({"workdir": workdir}, tmp_path / "copy")
    rows = {"640": [*args, "--config.data.tokens_per_batch=640", longer],
            "resumed": [f"--config={config}", f"--workdir={resuming}", *args[2:], batch, longer],
            "tested": [f"--config={config}", f"--workdir={resuming}", *args[2:-1], batch, longer]}
    results = rows_in_one_process("train.py", rows, tmp_path, env=script_env(2))
    assert_one_line_error(results["640"], "would be 10x64 (data.tokens_per_batch 576 -> 640)")
    assert snapshot(workdir) == before
    resumed, tested = results["resumed"], results["tested"]
    assert resumed.returncode == 0 and "no test translation" in resumed.stdout, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (resuming / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert tested.returncode == 0 and "test SacreBLEU" in tested.stdout, tested.stderr[-3000:]
    assert json.loads((resuming / "test_final.json").read_text())["step"] == 4
    assert (resuming / "plots" / "learning_curves.png").exists()


def test_sigterm_during_data_preparation_releases_the_lock_and_a_rerun_finishes(stopped_runs):
    returncode, stderr, left, rerun = stopped_runs["preparing"]
    assert returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM: nothing; training had not started") and "resumes" in last
    assert not left["lock"]
    assert not left["half written"] and not left["checkpoints"]
    assert rerun.returncode == 0 and "test SacreBLEU" in rerun.stdout, rerun.stderr[-3000:]


def test_train_takes_cudnn_out_of_xlas_command_buffers_before_the_backends_start_for_cudnn_attention(monkeypatch):
    """What train.py does before JAX starts: XLA_FLAGS gains -CUDNN for cuDNN attention; left alone otherwise."""
    from ml_collections import ConfigDict

    from transformer_jax.cli.cluster import set_gpu_flags

    model = ConfigDict(dict(attention_backend="cudnn", attention_dropout_rate=0.0, dtype="bfloat16"))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    set_gpu_flags(model)
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=-CUDNN"
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION,CUBLAS")  # the user's own setting
    set_gpu_flags(model)
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=FUSION,CUBLAS"
    for backend in ("auto", "fused", "einsum"):  # "auto" picks no cuDNN on GPUs yet (GPU_AUTO_BACKEND)
        monkeypatch.delenv("XLA_FLAGS")
        set_gpu_flags(ConfigDict(dict(model.to_dict(), attention_backend=backend)))
        assert "XLA_FLAGS" not in os.environ
        monkeypatch.setenv("XLA_FLAGS", "")
    # The installed XLA parses the flag (an illegal value of an XLA flag aborts the process at start).
    env = dict(os.environ, XLA_FLAGS="--xla_gpu_enable_command_buffer=-CUDNN")
    started = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; print(jnp.ones(2).sum())"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0 and started.stdout.strip() == "2.0", started.stderr[-2000:]
