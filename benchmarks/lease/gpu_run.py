"""One end-to-end run for a lent GPU, in one call of under 10 minutes: train.py with a profile, a preemption, a
short training with each attention backend, eval.py, tables.

    # here, once (CPU): prepare the corpus the lease trains on (Multi30k's raw EN/DE files, renamed
    # {train,dev,test}.{en,de}), and the preflight's predictions for the same run on the lease's GPU kinds
    # (JAX's CUDA plugin compiles them: pip install --no-deps jax-cuda12-plugin==V jax-cuda12-pjrt==V, V the
    # installed jax's version, in a virtualenv of its own or a --target folder on PYTHONPATH)
    python -m benchmarks.lease.gpu_run prepare --text DIR --out runs/lease --predict h200,h100
    # on the lease (the device tool, carry=[".whl", "runs/lease"]; .whl holds the wheels the GPU image lacks):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && R=$(mktemp -d) && \
    python3 -m benchmarks.lease.gpu_run run --lease runs/lease --out $R/r; cp $R/r/summary.json $OUT/
    # the rehearsal on a CPU (a tiny model, short phases):
    JAX_PLATFORMS=cpu python -m benchmarks.lease.gpu_run run --lease runs/lease --out /tmp/rehearsal --rehearse \
        --train_seconds 20 --resume_seconds 10 --backend_seconds 10

`run` trains the paper's base model (configs/wmt14_ende_base.py: bfloat16) with train.py on the prepared
corpus for --train_seconds of wall time (checkpoints, the periodic dev loss), tracing --profile_steps updates
with jax.profiler (training.profile_steps) after --profile_skip of them; stops it with SIGTERM, resumes it for
--resume_seconds more without the bound on the host's lead (training.max_updates_in_flight=1000) and stops it
again: the table sets both phases' tokens/s and SIGTERM-to-checkpoint seconds side by side. Then a short
training (--backend_seconds) with each attention backend the main run did not use (model.attention_backend: auto, fused, cudnn, einsum), each in its own run directory
and profiled too; a backend that fails does not stop the others. Then eval.py scores the test split (beam 4,
bfloat16) and translates a file of test sources. Phases that would not end within --budget seconds of the
call's start are left out and named. Extra `--config.KEY=VALUE` flags go to every train.py of the call. Last,
benchmarks/lease/decode.py times the trained run's beam and greedy searches on the test sources repeated to
--decode_sentences (sentences/s after compiling, compile seconds) and profiles one search batch; then again at the
first count with the decoding loop in XLA's command buffers (WHILE_COMMANDS). Before the decode phases,
benchmarks/lease/compare.py times ours against transformers' generate and CTranslate2 on the exported run
(--compare_sentences; CTranslate2 and its CUDA libraries are carried as wheels, or its row says why not).

It prints, from what the runs recorded: the main table (timing.jsonl: tokens/s, the host's share, checkpoint
stalls, start-up and resume; JAX's compile log: each program's compile time; eval.py's wall time) beside the
preflight's prediction for the GPU kind it runs on (made by `prepare`, carried in); the profile per update
(the device's busy time, kernels, the top 10, the host's launch calls: launch-bound or GPU-bound; on a CPU,
no device tracks); and the backends' table (finite or not, tokens/s, ms per update, the profile in brief).
Everything raw stays under --out, which must be new or empty (a run directory there would be resumed): the
logs, the run directories' records and traces, summary.json (written after each phase).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from benchmarks.lease.compare import compare_table
from benchmarks.lease.records import (PREDICTION, backend_table, bleu_of, compile_seconds, decode_table, error_line,
                                      finite_training, predicted, profile_of, table, timing_records, window_figures)
from benchmarks.workers import REPO
from transformer_jax.base import workdir as layout

CONFIG = "configs/wmt14_ende_base.py"
# The lease run's settings on top of the paper's base config: the corpus's own 8k vocabulary, a checkpoint and
# a dev loss every 200 updates, a log window every 50, no dev BLEU during training (eval.py scores the test set).
RUN_FLAGS = ("--config.data.source=text", "--config.data.vocab_size=8000", "--config.training.num_train_steps=1000000",
             "--config.training.checkpoint_every=200", "--config.training.eval_every=200",
             "--config.training.log_every=50", "--config.training.bleu_every=0")
# The rehearsal's model: the pipeline is the same, the model tiny enough for a CPU.
REHEARSAL_FLAGS = ("--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
                   "--config.model.num_heads=2", "--config.data.tokens_per_batch=1024",
                   "--config.training.checkpoint_every=20", "--config.training.eval_every=20",
                   "--config.training.log_every=10")
# model.attention_backend's choices on a GPU ("splash" is the TPUs' kernel).
BACKENDS = ("auto", "fused", "cudnn", "einsum")
BACKEND_FLAG = "--config.model.attention_backend="
# A backend's short run: no checkpoint or dev loss inside it (SIGTERM still saves one).
BACKEND_RUN_FLAGS = ("--config.training.checkpoint_every=1000000", "--config.training.eval_every=0")
TRANSLATE_LINES = 500
# The resume phase runs without the bound on the host's lead (training.max_updates_in_flight's largest value: more
# than a log window): the table sets its tokens/s and its stop beside the first phase's, which has the default (2).
UNBOUNDED_FLAG = "--config.training.max_updates_in_flight=1000"
# The decoding loop itself in XLA's command buffers (CUDA graphs' conditional nodes): no host read of the loop's
# predicate at each step. Not in XLA's default command-buffer types; the decode_while phase measures it.
WHILE_COMMANDS = "--xla_gpu_enable_command_buffer=+WHILE"


class OutNotEmpty(Exception):
    """--out holds files: a run directory there would be resumed, not started."""


def corpus_flags(lease: str) -> list[str]:
    return [f"--config.data.prepared={os.path.join(lease, layout.CORPUS)}", *RUN_FLAGS]


def profile_flags(steps: int, skip: int) -> list[str]:
    return [f"--config.training.profile_steps={steps}", f"--config.training.profile_skip_steps={skip}"]


def prepare(args: argparse.Namespace) -> None:
    """Prepare the corpus under --out/corpus and the preflight's predictions for the GPU kinds the lease lends."""
    corpus = os.path.join(args.out, layout.CORPUS)
    flags = [f"--config={CONFIG}", "--config.data.source=text", f"--config.data.path={args.text}",
             "--config.data.vocab_size=8000"]
    done = subprocess.run([sys.executable, "-m", "transformer_jax.cli.prepare", *flags, f"--output={corpus}"],
                          cwd=REPO)
    if done.returncode:  # the command said why on stderr, in its own line
        print(f"error: transformer-jax prepare exited {done.returncode} (its line above says why)", file=sys.stderr)
        sys.exit(done.returncode)
    for kind in args.predict.split(","):
        report = subprocess.run([sys.executable, "-m", "transformer_jax.aot", f"--config={CONFIG}",
                                 f"--topology={kind}", *corpus_flags(args.out)], capture_output=True, text=True,
                                cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if report.returncode:  # no prediction file: the run's table shows "-"; the whole error is kept beside it
            with open(os.path.join(args.out, PREDICTION.format(kind=kind) + ".error"), "w") as f:
                f.write(report.stdout + report.stderr)
            said = [line for line in report.stderr.splitlines() if line.startswith("error:") or "Error: " in line]
            print(f"the preflight for {kind} failed (exit {report.returncode}): {said[-1][:300] if said else ''} "
                  f"(all of it in {f.name})", file=sys.stderr)
            continue
        with open(os.path.join(args.out, PREDICTION.format(kind=kind)), "w") as f:
            f.write(report.stdout)
        print(report.stdout)


def train_phase(args: argparse.Namespace, workdir: str, log: str, seconds: float, flags: list[str],
                peak_memory: list[float]) -> dict[str, Any]:
    """Launch train.py with `flags`, let it train `seconds` after its first update (never past the call's
    deadline), SIGTERM it; its wall times and exit."""
    before = len(timing_records(workdir))
    launched = time.time()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "train.py", f"--config={CONFIG}", f"--workdir={workdir}", *flags],
                                   cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "JAX_LOG_COMPILES": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
        first_update = None
        deadline = min(launched + args.start_limit, args.deadline)
        while process.poll() is None:
            records = timing_records(workdir)[before:]
            if first_update is None and any("startup_seconds" in r for r in records):
                first_update = time.time()
                deadline = min(first_update + seconds, args.deadline)
            if time.time() >= deadline:
                process.send_signal(signal.SIGTERM)
                break
            used = gpu_memory_used_mb()
            if used is not None:
                peak_memory.append(used)
            time.sleep(0.5)
        signalled = time.time()
        try:
            code = process.wait(timeout=args.stop_limit)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    return {"launched": launched, "first_update_s": (first_update or signalled) - launched,
            "stop_s": time.time() - signalled, "exit": code, "wall_s": time.time() - launched}


def eval_phase(args: argparse.Namespace, workdir: str, log: str, extra: list[str]) -> dict[str, Any]:
    """Run eval.py with `extra` flags (beam 4, bfloat16); its wall time and exit."""
    started = time.time()
    with open(log, "w") as out:
        try:
            code = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--beam_size=4",
                                   "--dtype=bfloat16", *extra], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=max(min(args.eval_limit, args.deadline - started), 1),
                                  env={**os.environ, "JAX_LOG_COMPILES": "1"}).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"wall_s": time.time() - started, "exit": code}


def decode_phase(args: argparse.Namespace, workdir: str, sources: str, log: str, out: str, counts: str,
                 xla_flags: str = "") -> dict[str, Any]:
    """benchmarks/lease/decode.py on the trained run: sentences/s per mode at each count, compile s, a profiled
    search batch; its figures (decode.json) with the wall time and exit. `xla_flags` go to XLA_FLAGS."""
    started = time.time()
    env = {**os.environ, "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), xla_flags]))}
    with open(log, "w") as stream:
        try:
            code = subprocess.run([sys.executable, "-m", "benchmarks.lease.decode", f"--workdir={workdir}",
                                   f"--sources={sources}", f"--out={out}", f"--sentences={counts}"], cwd=REPO,
                                  stdout=stream, stderr=subprocess.STDOUT, env=env,
                                  timeout=max(min(args.decode_limit, args.deadline - started), 1)).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    figures = {}
    if os.path.exists(os.path.join(out, "decode.json")):
        with open(os.path.join(out, "decode.json")) as f:
            figures = json.load(f)
    return {"wall_s": time.time() - started, "exit": code, **figures}


def compare_phase(args: argparse.Namespace, workdir: str, log: str, out: str) -> dict[str, Any]:
    """benchmarks/lease/compare.py: ours, transformers' generate and CTranslate2 on the test split (the exported
    run), beam 4 and greedy, 16-bit on a GPU; its rows with the wall time and exit."""
    started = time.time()
    counts = args.compare_sentences if not args.rehearse else "30"
    with open(log, "w") as stream:
        try:
            code = subprocess.run([sys.executable, "-m", "benchmarks.lease.compare", f"--workdir={workdir}",
                                   f"--pairs={os.path.join(args.lease, layout.CORPUS, 'test.json')}", f"--out={out}",
                                   f"--sentences={counts}"], cwd=REPO, stdout=stream, stderr=subprocess.STDOUT,
                                  timeout=max(min(args.compare_limit, args.deadline - started), 1)).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    rows = []
    if os.path.exists(os.path.join(out, "compare.json")):
        with open(os.path.join(out, "compare.json")) as f:
            rows = json.load(f)["rows"]
    return {"wall_s": time.time() - started, "exit": code, "rows": rows}


def write_test_sources(lease: str, path: str, lines: int) -> int:
    """Write the first `lines` test sources of the prepared corpus to `path`; returns how many."""
    with open(os.path.join(lease, layout.CORPUS, "test.json")) as f:
        test = json.load(f)
    sources = test["source"] if isinstance(test, dict) and "source" in test else [pair[0] for pair in test]
    with open(path, "w") as f:
        f.write("\n".join(sources[:lines]) + "\n")
    return min(lines, len(sources))


def gpu_memory_used_mb() -> float | None:
    """The GPU's memory in use by all processes (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def mfu(tokens_per_second: float | None, width: int, rehearse: bool, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation of the real target tokens: FLOPs per token slot of a row `width` wide (source and
    target rows alike, model/flops.py) x real tokens/s / the chip's peak."""
    from transformer_jax.model import TransformerConfig, train_step_flops

    if not tokens_per_second or not peak_flops:
        return None
    model = (TransformerConfig(vocab_size=8000, num_layers=1, d_model=32, d_ff=64, num_heads=2) if rehearse
             else TransformerConfig.preset("base", vocab_size=8000))
    return tokens_per_second * train_step_flops(model, 1, width, width) / width / peak_flops


def gpu_kind(device_kind: str, rehearse: bool) -> str:
    """The preflight's name for the GPU kind the call runs on (the lease's H200 for a rehearsal)."""
    from transformer_jax.aot import CHIPS

    if rehearse:
        return "h200"
    return next((key for key, chip in CHIPS.items() if chip.is_gpu and key.upper() in device_kind), device_kind)


def main_backend(extra: list[str]) -> str:
    """The attention backend the main run uses: the last --config.model.attention_backend of `extra`, else auto."""
    chosen = [flag[len(BACKEND_FLAG):] for flag in extra if flag.startswith(BACKEND_FLAG)]
    return chosen[-1] if chosen else "auto"


def left(args: argparse.Namespace) -> float:
    return args.deadline - time.time()


def run(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """The lease run (see the module docstring); writes --out/summary.json after each phase and prints the tables."""
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    workdir = out("run")
    model = list(REHEARSAL_FLAGS) if args.rehearse else []
    flags = [*corpus_flags(args.lease), *model, *extra]
    env = subprocess.run([sys.executable, "-c", "import jax, flax, optax; d = jax.devices()[0]; "
                          "print(jax.__version__, flax.__version__, optax.__version__, d.platform, d.device_kind)"],
                         capture_output=True, text=True, cwd=REPO).stdout.split()
    device_kind = " ".join(env[4:]) if len(env) > 4 else "unknown"
    kind = gpu_kind(device_kind, args.rehearse)
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": device_kind,
                               "versions": dict(zip(("jax", "flax", "optax", "platform"), env[:4])),
                               "rehearsal": args.rehearse, "flags": flags, "extra_flags": extra,
                               "prediction": {"kind": kind, **predicted(args.lease, kind)}, "skipped": [],
                               "backends": {}}

    def save() -> None:
        with open(out("summary.json"), "w") as f:
            json.dump(summary, f, indent=1)

    peak_memory: list[float] = []
    profiled = profile_flags(args.profile_steps, args.profile_skip)
    summary["train"] = train_phase(args, workdir, out("train.log"), args.train_seconds, [*flags, *profiled],
                                   peak_memory)
    summary["train"].update(window_figures(timing_records(workdir)))
    summary["trace"] = profile_of(workdir)
    save()
    records_after_first = len(timing_records(workdir))
    start_cost = summary["train"]["first_update_s"]  # what a later start is budgeted (cached compiles cost less)
    if left(args) > start_cost + args.resume_seconds + args.stop_limit / 4:
        # Without the bound on the host's lead: its tokens/s and its stop, against the first phase's (K = 2).
        summary["resume"] = train_phase(args, workdir, out("resume.log"), args.resume_seconds,
                                        [*flags, UNBOUNDED_FLAG], peak_memory)
        summary["resume"].update(window_figures(timing_records(workdir)[records_after_first:]))
    else:
        summary["skipped"].append("resume")
    save()
    for backend in (b for b in args.backends.split(",") if b and b != main_backend(extra)):
        summary["backends"][backend] = backend_phase(args, backend, flags, peak_memory, start_cost)
        save()
    summary["gpu_memory_peak_mb"] = max(peak_memory) if peak_memory else None
    lines = write_test_sources(args.lease, out("translate.src"), TRANSLATE_LINES)
    for phase, extra_eval, need in (("eval", [], 60), ("translate", [f"--translate={out('translate.src')}"], 30)):
        if left(args) < need:  # eval.py --translate prints the translations: they go to translate.log
            summary["skipped"].append(phase)
            continue
        summary[phase] = eval_phase(args, workdir, out(f"{phase}.log"), extra_eval)
    if "eval" in summary:
        summary["eval"]["bleu"] = bleu_of(out("eval.log"))
        with open(os.path.join(args.lease, layout.CORPUS, "test.json")) as f:
            summary["eval"]["sentences"] = len(json.load(f))
    if "translate" in summary:
        summary["translate"]["lines"] = lines
    counts = args.decode_sentences if not args.rehearse else "40,200"
    if left(args) >= 90:
        summary["compare"] = compare_phase(args, workdir, out("compare.log"), out("compare"))
        save()
    else:
        summary["skipped"].append("compare")
    variants = (("decode", counts, ""), ("decode_while", counts.split(",")[0], WHILE_COMMANDS))
    for phase, phase_counts, xla_flags in variants:
        if left(args) < 60:
            summary["skipped"].append(phase)
            continue
        summary[phase] = decode_phase(args, workdir, out("translate.src"), out(f"{phase}.log"), out(phase),
                                      phase_counts, xla_flags)
        save()
    summary["compile_seconds"] = {phase: compile_seconds(out(f"{phase}.log"))
                                  for phase in ("train", "resume", "eval", "translate")}
    from transformer_jax.aot import CHIPS

    chip = CHIPS.get(kind)
    width = int(summary["prediction"].get("width", 256))
    summary["train"]["mfu"] = mfu(summary["train"]["tokens_per_second"], width, args.rehearse,
                                  chip and chip.peak_bf16_flops)
    save()
    print(table(summary))
    print("\n".join(["", *(summary["trace"].get("lines") or ["profile: none written (see train.log)"]), ""]))
    print(f"main run's attention backend: {main_backend(extra)}")
    print(backend_table(summary["backends"]))
    print("\n" + decode_table(summary.get("decode", {})))
    print("\nours, transformers' generate and CTranslate2 on the same sentences (exported with --format=hf):")
    print(compare_table(summary.get("compare", {}).get("rows", [])))
    print(f"with XLA_FLAGS={WHILE_COMMANDS} (the loop in a command buffer):")
    print(decode_table(summary.get("decode_while", {})))
    report_failures(args, summary)
    return summary


def backend_phase(args: argparse.Namespace, backend: str, flags: list[str], peak_memory: list[float],
                  start_cost: float) -> dict[str, Any]:
    """A short training with `backend` in its own run directory, profiled: exit, finite or not, figures."""
    if left(args) < start_cost + args.backend_seconds + args.stop_limit / 4:
        return {"skipped": "out of the call's time"}
    workdir, log = os.path.join(args.out, f"backend-{backend}"), os.path.join(args.out, f"backend-{backend}.log")
    phase = train_phase(args, workdir, log, args.backend_seconds,
                        [*flags, *BACKEND_RUN_FLAGS, *profile_flags(min(args.profile_steps, 3), args.profile_skip),
                         f"{BACKEND_FLAG}{backend}"], peak_memory)
    figures = window_figures(timing_records(workdir))
    return {**phase, **{k: figures[k] for k in ("tokens_per_second", "seconds_per_update", "last_step")},
            **finite_training(workdir), "trace": profile_of(workdir), "error": error_line(log)}


def report_failures(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """Exit 1 naming the main run's phases that failed (a backend's failure is a finding, in its table)."""
    # A stop by SIGTERM exits 0 (or 143, the signal's own status); eval.py's jobs exit 0.
    failed = [phase for phase in ("train", "resume") if phase in summary and summary[phase]["exit"] not in (0, 143)]
    failed += [phase for phase in ("eval", "translate", "decode") if phase in summary and summary[phase]["exit"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)} (see {args.out}/<phase>.log)", file=sys.stderr)
        sys.exit(1)


def check_out(path: str) -> None:
    """Refuse an --out that holds anything: its run directory would be resumed instead of started."""
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise OutNotEmpty(f"--out {path} is not empty (a run there would resume, not start); pass a new folder, "
                          "e.g. --out $(mktemp -d)/r")


def run_problem(args: argparse.Namespace) -> str | None:
    """What makes `run`'s flags unusable, checked before anything is written (None: fine): --out not empty, a
    --lease folder without the corpus `prepare` writes, an attention backend that does not exist."""
    try:
        check_out(args.out)
    except OutNotEmpty as error:
        return str(error)
    manifest = os.path.join(args.lease, layout.CORPUS, "manifest.json")
    if not os.path.isfile(manifest):
        return (f"--lease {args.lease} holds no prepared corpus ({manifest} is missing); make it here first with "
                f"python -m benchmarks.lease.gpu_run prepare --text DIR --out {args.lease}, and carry it to the lease")
    unknown = [name for name in args.backends.split(",") if name and name not in BACKENDS]
    if unknown:
        return f"--backends names {', '.join(unknown)}, not attention backends; choose among {','.join(BACKENDS)}"
    return None


def prepare_problem(args: argparse.Namespace) -> str | None:
    """What makes `prepare`'s --text unusable (None: fine): not a folder, or without train.en and train.de."""
    if not os.path.isdir(args.text):
        return f"--text {args.text} is not a folder; pass the folder of {{train,dev,test}}.{{en,de}}"
    missing = [name for name in ("train.en", "train.de") if not os.path.isfile(os.path.join(args.text, name))]
    if missing:
        return f"--text {args.text} has no {' or '.join(missing)}; it must hold {{train,dev,test}}.{{en,de}}"
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="the corpus and the preflight's predictions (here, on a CPU)")
    prep.add_argument("--text", required=True, help="directory of {train,dev,test}.{en,de}")
    prep.add_argument("--out", default="runs/lease")
    prep.add_argument("--predict", default="h200,h100", help="GPU topologies to predict for (the preflight's names)")
    go = commands.add_parser("run", help="the lease run; --config.KEY=VALUE flags go to every train.py")
    go.add_argument("--lease", default="runs/lease", help="what prepare made (carried to the lease)")
    go.add_argument("--out", required=True, help="a new or empty folder")
    go.add_argument("--train_seconds", type=float, default=90, help="training after the first update")
    go.add_argument("--resume_seconds", type=float, default=30, help="training after the resumed first update")
    go.add_argument("--backends", default=",".join(BACKENDS),
                    help="attention backends to train briefly (the main run's own is left out)")
    go.add_argument("--backend_seconds", type=float, default=20, help="each backend's training after its first update")
    go.add_argument("--profile_steps", type=int, default=5, help="updates the main run traces (0: none)")
    go.add_argument("--profile_skip", type=int, default=20, help="updates after a start before the trace")
    go.add_argument("--budget", type=float, default=520, help="seconds for the whole call: later phases left out")
    go.add_argument("--start_limit", type=float, default=150, help="longest wait for a first update")
    go.add_argument("--stop_limit", type=float, default=60, help="longest wait from SIGTERM to exit")
    go.add_argument("--eval_limit", type=float, default=150)
    go.add_argument("--decode_sentences", default="1000,100000",
                    help="decode: sentences timed per search mode (the test sources repeated), comma-separated")
    go.add_argument("--decode_limit", type=float, default=240, help="longest the decode phase may take")
    go.add_argument("--compare_sentences", default="1000",
                    help="compare: test sentences (repeated) each of ours, transformers and CTranslate2 translates "
                         "per mode; 100000 needs a call of its own")
    go.add_argument("--compare_limit", type=float, default=200, help="longest the comparison may take")
    go.add_argument("--rehearse", action="store_true", help="a tiny model, for a CPU")
    args, extra = parser.parse_known_args(argv)
    unknown = [flag for flag in extra if not flag.startswith("--config.") or "=" not in flag]
    if unknown or (extra and args.command != "run"):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)} (only run takes --config.KEY=VALUE)")
    problem = prepare_problem(args) if args.command == "prepare" else run_problem(args)
    if problem:  # before anything is written: the same command, corrected, starts clean
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if args.command == "prepare":
        prepare(args)
        return
    args.deadline = time.time() + args.budget
    run(args, extra)


if __name__ == "__main__":
    main()
