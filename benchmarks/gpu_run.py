"""One end-to-end run for a lent GPU, in one call of under 9 minutes: train.py, a preemption, eval.py, a table.

    # here, once (CPU): prepare the corpus the lease trains on (Multi30k's raw EN/DE files, renamed
    # {train,dev,test}.{en,de}), and the preflight's prediction for the same run on the lease's GPU kind
    python -m benchmarks.gpu_run prepare --text DIR --out runs/lease
    # on the lease (the device tool, carry=["runs/lease"]):
    python -m benchmarks.gpu_run run --lease runs/lease --out $OUT
    # the rehearsal on a CPU (a tiny model, short phases):
    JAX_PLATFORMS=cpu python -m benchmarks.gpu_run run --lease runs/lease --out /tmp/rehearsal --rehearse

`run` trains the paper's base model (configs/wmt14_ende_base.py: bfloat16) with train.py on the prepared
corpus for --train_seconds of wall time (checkpoints, the periodic dev loss), stops it with SIGTERM,
resumes it for --resume_seconds more and stops it again; then eval.py scores the test split (beam 4,
bfloat16) and translates a file of test sources. It reads back what the run recorded (timing.jsonl: tokens/s,
the host's share, checkpoint stalls, start-up and resume; JAX's compile log: each program's compile time;
eval.py's wall time) and prints one table beside the preflight's prediction for the same run on the same
GPU kind (made here by `prepare`, carried in). Everything raw stays under --out: the logs, the run directory's
records, summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

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
TRANSLATE_LINES = 500
PREDICTION = "prediction-{kind}.txt"
# JAX's compile log (jax_log_compiles): "Finished XLA compilation of jit(NAME) in SECONDS sec".
COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.]+) s")


def corpus_flags(lease: str) -> list[str]:
    return [f"--config.data.prepared={os.path.join(lease, layout.CORPUS)}", *RUN_FLAGS]


def prepare(args: argparse.Namespace) -> None:
    """Prepare the corpus under --out/corpus and the preflight's predictions for the GPU kinds the lease lends."""
    corpus = os.path.join(args.out, layout.CORPUS)
    flags = [f"--config={CONFIG}", "--config.data.source=text", f"--config.data.path={args.text}",
             "--config.data.vocab_size=8000"]
    subprocess.run([sys.executable, "-m", "transformer_jax.cli.prepare", *flags, f"--output={corpus}"],
                   check=True, cwd=REPO)
    for kind in args.predict.split(","):
        report = subprocess.run([sys.executable, "-m", "transformer_jax.aot", f"--config={CONFIG}",
                                 f"--topology={kind}", *corpus_flags(args.out)], capture_output=True, text=True,
                                cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if report.returncode:  # no prediction file: the run's table shows "-"; the whole error is kept beside it
            with open(os.path.join(args.out, PREDICTION.format(kind=kind) + ".error"), "w") as f:
                f.write(report.stdout + report.stderr)
            print(f"the preflight for {kind} failed (exit {report.returncode}); see {f.name}", file=sys.stderr)
            continue
        with open(os.path.join(args.out, PREDICTION.format(kind=kind)), "w") as f:
            f.write(report.stdout)
        print(report.stdout)


def timing_records(workdir: str) -> list[dict[str, Any]]:
    path = layout.run_path(workdir, layout.TIMING)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_phase(args: argparse.Namespace, workdir: str, log: str, seconds: float, extra: list[str],
                peak_memory: list[float]) -> dict[str, Any]:
    """Launch train.py, let it train `seconds` after its first update, SIGTERM it; its wall times and exit."""
    before = len(timing_records(workdir))
    launched = time.time()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "train.py", f"--config={CONFIG}", f"--workdir={workdir}",
                                    *corpus_flags(args.lease), *extra], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "JAX_LOG_COMPILES": "1",
                                        "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
        first_update = None
        deadline = launched + args.start_limit
        while process.poll() is None:
            records = timing_records(workdir)[before:]
            if first_update is None and any("startup_seconds" in r for r in records):
                first_update = time.time()
                deadline = first_update + seconds
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
        code = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--beam_size=4", "--dtype=bfloat16",
                               *extra], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=args.eval_limit,
                              env={**os.environ, "JAX_LOG_COMPILES": "1"}).returncode
    return {"wall_s": time.time() - started, "exit": code}


def compile_seconds(log: str) -> dict[str, float]:
    """{program: seconds} from JAX's compile log in `log` (the programs compiled more than once summed)."""
    programs: dict[str, float] = {}
    with open(log, errors="replace") as f:
        for name, seconds in COMPILED.findall(f.read()):
            programs[name] = programs.get(name, 0.0) + float(seconds)
    return programs


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


def median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def predicted(lease: str, kind: str) -> dict[str, Any]:
    """The preflight's predicted ms per update, peak memory and row width for the run (prepare's report)."""
    path = os.path.join(lease, PREDICTION.format(kind=kind))
    if not os.path.exists(path):
        return {}
    text = open(path).read()
    found = {}
    for key, pattern in (("ms_per_update", r"predicted\s+([0-9.]+) ms per update"),
                         ("peak_gb", r"memory\s+peak ([0-9.]+) GB"), ("width", r"rows x ([0-9]+) tokens")):
        match = re.search(pattern, text)
        if match:
            found[key] = float(match.group(1))
    return found


def window_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over a phase's log windows (the first left out: it holds the first steps' warm-up); the host's
    seconds per update are each window's seconds over its updates."""
    windows = [r for r in records if "tokens_per_second" in r]
    per_update = {key: [] for key in ("input_seconds", "dispatch_seconds", "sync_seconds")}
    for before, window in zip(windows, windows[1:]):
        updates = max(window["step"] - before["step"], 1)
        for key, values in per_update.items():
            values.append(window.get(key, 0.0) / updates)
    pick = lambda key: median([r[key] for r in windows[1:] if key in r])  # noqa: E731
    return {"windows": len(windows[1:]), "tokens_per_second": pick("tokens_per_second"),
            "seconds_per_update": pick("seconds_per_step"), "host_share": pick("host_share"),
            **{f"{key}_per_update": median(values) for key, values in per_update.items()},
            "checkpoint_stalls": [round(r["checkpoint_stall_seconds"], 3) for r in records
                                  if "checkpoint_stall_seconds" in r],
            "eval_seconds": [round(r["eval_seconds"], 2) for r in records if "eval_seconds" in r],
            "start": next((r for r in records if "startup_seconds" in r), {}),
            "last_step": windows[-1]["step"] if windows else 0}


def mfu(tokens_per_second: float | None, width: int, rehearse: bool, peak_flops: float) -> float | None:
    """Model FLOPs utilisation of the real target tokens: FLOPs per token slot of a row `width` wide (source and
    target rows alike, model/flops.py) x real tokens/s / the chip's peak."""
    from transformer_jax.model import TransformerConfig, train_step_flops

    if not tokens_per_second or not peak_flops:
        return None
    model = (TransformerConfig(vocab_size=8000, num_layers=1, d_model=32, d_ff=64, num_heads=2) if rehearse
             else TransformerConfig.preset("base", vocab_size=8000))
    return tokens_per_second * train_step_flops(model, 1, width, width) / width / peak_flops


def bleu_of(log: str) -> float | None:
    """The SacreBLEU score eval.py printed in `log`."""
    match = re.search(r"SacreBLEU\D*([0-9]+\.[0-9]+)", open(log, errors="replace").read())
    return float(match.group(1)) if match else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The lease run (see the module docstring); writes --out/summary.json and prints the table."""
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    workdir = out("run")
    extra = list(REHEARSAL_FLAGS) if args.rehearse else []
    env = subprocess.run([sys.executable, "-c", "import jax, flax, optax; d = jax.devices()[0]; "
                          "print(jax.__version__, flax.__version__, optax.__version__, d.platform, d.device_kind)"],
                         capture_output=True, text=True, cwd=REPO).stdout.split()
    device_kind = " ".join(env[4:]) if len(env) > 4 else "unknown"
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": device_kind,
                               "versions": dict(zip(("jax", "flax", "optax", "platform"), env[:4])),
                               "rehearsal": args.rehearse, "flags": [*corpus_flags(args.lease), *extra]}
    peak_memory = []
    summary["train"] = train_phase(args, workdir, out("train.log"), args.train_seconds, extra, peak_memory)
    summary["train"].update(window_figures(timing_records(workdir)))
    records_after_first = len(timing_records(workdir))
    summary["resume"] = train_phase(args, workdir, out("resume.log"), args.resume_seconds, extra, peak_memory)
    summary["resume"].update(window_figures(timing_records(workdir)[records_after_first:]))
    summary["gpu_memory_peak_mb"] = max(peak_memory) if peak_memory else None
    lines = write_test_sources(args.lease, out("translate.src"), TRANSLATE_LINES)
    summary["eval"] = eval_phase(args, workdir, out("eval.log"), [])
    summary["eval"]["bleu"] = bleu_of(out("eval.log"))
    # eval.py --translate prints the translations: they go to translate.log with its other lines.
    summary["translate"] = eval_phase(args, workdir, out("translate.log"), [f"--translate={out('translate.src')}"])
    summary["translate"]["lines"] = lines
    summary["compile_seconds"] = {phase: compile_seconds(out(f"{phase}.log"))
                                  for phase in ("train", "resume", "eval", "translate")}
    kind = "h100" if "H100" in device_kind or args.rehearse else "h200" if "H200" in device_kind else device_kind
    summary["prediction"] = {"kind": kind, **predicted(args.lease, kind)}
    with open(os.path.join(args.lease, layout.CORPUS, "test.json")) as f:
        summary["eval"]["sentences"] = len(json.load(f))
    from transformer_jax.aot import CHIPS

    peak = CHIPS["h100"].peak_bf16_flops  # the H200 has the H100's tensor cores (989 dense bf16 TFLOP/s)
    width = int(summary["prediction"].get("width", 256))
    summary["train"]["mfu"] = mfu(summary["train"]["tokens_per_second"], width, args.rehearse, peak)
    with open(out("summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(table(summary))
    # A stop by SIGTERM exits 0 (or 143, the signal's own status); eval.py's jobs exit 0.
    failed = [phase for phase in ("train", "resume") if summary[phase]["exit"] not in (0, 143)]
    failed += [phase for phase in ("eval", "translate") if summary[phase]["exit"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)} (see {args.out}/<phase>.log)", file=sys.stderr)
        sys.exit(1)
    return summary


def _f(value: Any, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def _programs(seconds: dict[str, float]) -> str:
    return "; ".join(f"{name} {value:.1f} s" for name, value in sorted(seconds.items(), key=lambda item: -item[1])
                     if value >= 0.1)


def table(s: dict[str, Any]) -> str:
    """The summary as one Markdown table."""
    t, r, e, tr, p = s["train"], s["resume"], s["eval"], s["translate"], s["prediction"]
    compiled = s["compile_seconds"]
    eval_compile = sum(compiled["eval"].values())
    rows = [
        ("device", f"{s['device']} ({s['versions'].get('platform', '?')}), jax {s['versions'].get('jax', '?')}"
                   + (" - REHEARSAL (tiny model on a CPU)" if s["rehearsal"] else "")),
        ("train: launch to first update", _f(t["first_update_s"], 1, " s")),
        ("train: updates / windows timed", f"{t['last_step']} / {t['windows']}"),
        ("real target tokens/s (median window)", _f(t["tokens_per_second"], 0)),
        ("ms per update (median window)", _f(t["seconds_per_update"] and t["seconds_per_update"] * 1e3, 2)),
        ("preflight's prediction, ms per update", _f(p.get("ms_per_update"), 2) + f" ({p['kind']} roofline)"),
        ("MFU of real target tokens", _f(t["mfu"] and 100 * t["mfu"], 1, "%")
         + f" (FLOPs per token at rows {int(p.get('width', 256))} wide: the prediction's width, else 256)"),
        ("host share of a window (median)", _f(t["host_share"], 2)),
        ("host s per update: input / dispatch / wait for device",
         " / ".join(_f(t[f"{k}_seconds_per_update"] and 1e3 * t[f"{k}_seconds_per_update"], 2, " ms")
                    for k in ("input", "dispatch", "sync"))),
        ("GPU memory in use, peak (nvidia-smi)", _f(s["gpu_memory_peak_mb"], 0, " MB")),
        ("preflight's peak memory", _f(p.get("peak_gb"), 2, " GB")),
        ("checkpoint stalls", ", ".join(f"{x:.2f}" for x in t["checkpoint_stalls"] + r["checkpoint_stalls"]) + " s"),
        ("dev-loss evaluations", ", ".join(f"{x:.1f}" for x in t["eval_seconds"] + r["eval_seconds"]) + " s"),
        ("compile, train.py (programs over 0.1 s)", _programs(compiled["train"])),
        ("compile, eval.py (programs over 0.1 s)", _programs(compiled["eval"])),
        ("SIGTERM to exit / exit status", f"{_f(t['stop_s'], 1, ' s')} / {t['exit']}"),
        ("resume: launch to first update", _f(r["first_update_s"], 1, " s")),
        ("resume: start-up / restore / compile",
         " / ".join(_f(r["start"].get(k), 1, " s") for k in ("startup_seconds", "restore_seconds", "compile_seconds"))),
        ("resume: updates, tokens/s", f"to step {r['last_step']}, {_f(r['tokens_per_second'], 0)}"),
        ("eval.py test split: wall / compile / exit",
         f"{_f(e['wall_s'], 1, ' s')} / {_f(eval_compile, 1, ' s')} / {e['exit']}"),
        ("eval sentences/s (wall; without compile)",
         f"{_f(e['sentences'] / e['wall_s'], 1)}; {_f(e['sentences'] / max(e['wall_s'] - eval_compile, 1e-9), 1)}"),
        ("test SacreBLEU of the short run", _f(e["bleu"], 2)),
        ("eval.py --translate: lines / wall / exit", f"{tr['lines']} / {_f(tr['wall_s'], 1, ' s')} / {tr['exit']}"),
    ]
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="the corpus and the preflight's predictions (here, on a CPU)")
    prep.add_argument("--text", required=True, help="directory of {train,dev,test}.{en,de}")
    prep.add_argument("--out", default="runs/lease")
    prep.add_argument("--predict", default="h100", help="GPU topologies to predict for (the preflight's names)")
    go = commands.add_parser("run", help="the lease run")
    go.add_argument("--lease", default="runs/lease", help="what prepare made (carried to the lease)")
    go.add_argument("--out", required=True)
    go.add_argument("--train_seconds", type=float, default=120, help="training after the first update")
    go.add_argument("--resume_seconds", type=float, default=60, help="training after the resumed first update")
    go.add_argument("--start_limit", type=float, default=150, help="longest wait for a first update")
    go.add_argument("--stop_limit", type=float, default=60, help="longest wait from SIGTERM to exit")
    go.add_argument("--eval_limit", type=float, default=150)
    go.add_argument("--rehearse", action="store_true", help="a tiny model, for a CPU")
    args = parser.parse_args(argv)
    (prepare if args.command == "prepare" else run)(args)


if __name__ == "__main__":
    main()
