"""What a lease run (benchmarks/lease/gpu_run.py) reads back: the run directory's records, the logs, the preflight's
prediction and the profile, and the tables it prints from them."""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from transformer_jax.base import workdir as layout
from transformer_jax.base import read_metrics
from transformer_jax.run import newest_trace, read_trace, summarize_trace

PREDICTION = "prediction-{kind}.txt"
# JAX's compile log (jax_log_compiles): "Finished XLA compilation of jit(NAME) in SECONDS sec".
COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.]+) s")


def timing_records(workdir: str) -> list[dict[str, Any]]:
    path = layout.run_path(workdir, layout.TIMING)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compile_seconds(log: str) -> dict[str, float]:
    """{program: seconds} from JAX's compile log in `log` (the programs compiled more than once summed)."""
    programs: dict[str, float] = {}
    if not os.path.exists(log):
        return programs
    with open(log, errors="replace") as f:
        for name, seconds in COMPILED.findall(f.read()):
            programs[name] = programs.get(name, 0.0) + float(seconds)
    return programs


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
    per_update = {key: [] for key in ("input_seconds", "dispatch_seconds", "lead_wait_seconds", "sync_seconds")}
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
            "stop": next((r for r in records if "stop_seconds" in r), {}),
            "stop_estimate_seconds": next((r["stop_estimate_seconds"] for r in records
                                           if "stop_estimate_seconds" in r), None),
            "last_step": windows[-1]["step"] if windows else 0}


def finite_training(workdir: str) -> dict[str, Any]:
    """Whether every logged training loss and gradient norm of the run is finite, and the last loss."""
    train = [r for r in read_metrics(workdir) if r.get("split") == "train"] if os.path.exists(
        layout.run_path(workdir, layout.METRICS)) else []
    finite = [all(math.isfinite(r.get(key, 0.0)) for key in ("loss", "grad_norm")) for r in train]
    return {"logged": len(train), "finite": bool(train) and all(finite), "non_finite": finite.count(False),
            "last_loss": train[-1]["loss"] if train else None}


def profile_of(workdir: str) -> dict[str, Any]:
    """The newest profile of the run, summarized per update (trace_summary), with its lines; {} without one."""
    trace = newest_trace(layout.run_path(workdir, layout.PROFILE))
    if trace is None:
        return {}
    summary = summarize_trace(read_trace(trace))
    return {**summary.to_json(), "lines": summary.lines(), "trace": trace}


def error_line(log: str) -> str:
    """The run's one-line error (`error: ...`), else its last line; "" without a log."""
    if not os.path.exists(log):
        return ""
    lines = [line.strip() for line in open(log, errors="replace").read().replace("\r", "\n").splitlines()
             if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def bleu_of(log: str) -> float | None:
    """The SacreBLEU score eval.py printed in `log`."""
    if not os.path.exists(log):
        return None
    match = re.search(r"SacreBLEU\D*([0-9]+\.[0-9]+)", open(log, errors="replace").read())
    return float(match.group(1)) if match else None


def _f(value: Any, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def _ms(seconds: float | None) -> str:
    return _f(seconds and 1e3 * seconds, 2)


def _programs(seconds: dict[str, float]) -> str:
    return "; ".join(f"{name} {value:.1f} s" for name, value in sorted(seconds.items(), key=lambda item: -item[1])
                     if value >= 0.1)


def _stop(record: dict[str, Any]) -> str:
    """A stop's timing.jsonl record: seconds from the signal to the checkpoint, and the steps between."""
    if "stop_seconds" not in record:
        return "-"
    return f"{record['stop_seconds']:.1f} s (signal at step {record['signal_step']}, checkpoint {record['step']})"


def table(s: dict[str, Any]) -> str:
    """The main run's figures as one Markdown table (a phase not run shows "-")."""
    t, r, e, tr = (s.get(phase) or {} for phase in ("train", "resume", "eval", "translate"))
    p, compiled = s.get("prediction", {}), s.get("compile_seconds", {})
    eval_compile = sum(compiled.get("eval", {}).values())
    start = r.get("start", {})
    sentences = e.get("sentences")
    per_sentence = (f"{_f(sentences / e['wall_s'], 1)}; {_f(sentences / max(e['wall_s'] - eval_compile, 1e-9), 1)}"
                    if sentences and e.get("wall_s") else "-")
    rows = [
        ("device", f"{s['device']} ({s['versions'].get('platform', '?')}), jax {s['versions'].get('jax', '?')}"
                   + (" - REHEARSAL (tiny model on a CPU)" if s["rehearsal"] else "")),
        ("extra flags", " ".join(s.get("extra_flags", [])) or "none"),
        ("train: launch to first update", _f(t.get("first_update_s"), 1, " s")),
        ("train: updates / windows timed", f"{t.get('last_step', '-')} / {t.get('windows', '-')}"),
        ("real target tokens/s (median window)", _f(t.get("tokens_per_second"), 0)),
        ("ms per update (median window)", _ms(t.get("seconds_per_update"))),
        ("preflight's prediction, ms per update", _f(p.get("ms_per_update"), 2) + f" ({p.get('kind')} roofline)"),
        ("MFU of real target tokens", _f(t.get("mfu") and 100 * t["mfu"], 1, "%")
         + f" (FLOPs per token at rows {int(p.get('width', 256))} wide: the prediction's width, else 256)"),
        ("host share of a window (median)", _f(t.get("host_share"), 2)),
        ("host ms per update: input / dispatch / bound's wait (K=2) / window's wait",
         " / ".join(_ms(t.get(f"{k}_seconds_per_update")) for k in ("input", "dispatch", "lead_wait", "sync"))),
        ("GPU memory in use, peak (nvidia-smi)", _f(s.get("gpu_memory_peak_mb"), 0, " MB")),
        ("preflight's peak memory", _f(p.get("peak_gb"), 2, " GB")),
        ("checkpoint stalls", ", ".join(f"{x:.2f}" for x in t.get("checkpoint_stalls", []) + r.get(
            "checkpoint_stalls", [])) + " s"),
        ("dev-loss evaluations", ", ".join(f"{x:.1f}" for x in t.get("eval_seconds", []) + r.get(
            "eval_seconds", [])) + " s"),
        ("compile, train.py (programs over 0.1 s)", _programs(compiled.get("train", {}))),
        ("compile, eval.py (programs over 0.1 s)", _programs(compiled.get("eval", {}))),
        ("SIGTERM to exit / exit status", f"{_f(t.get('stop_s'), 1, ' s')} / {t.get('exit', '-')}"),
        ("SIGTERM to checkpoint on disk: K=2 (train) / no bound (resume)",
         " / ".join(_stop(phase.get("stop", {})) for phase in (t, r))),
        ("the run's stop estimate (K=2, its first checkpoint write)", _f(t.get("stop_estimate_seconds"), 1, " s")),
        ("resume: launch to first update", _f(r.get("first_update_s"), 1, " s")),
        ("resume: start-up / restore / compile",
         " / ".join(_f(start.get(k), 1, " s") for k in ("startup_seconds", "restore_seconds", "compile_seconds"))),
        ("resume with no bound (K=1000): updates, tokens/s",
         f"to step {r.get('last_step', '-')}, {_f(r.get('tokens_per_second'), 0)}"),
        ("eval.py test split: wall / compile / exit",
         f"{_f(e.get('wall_s'), 1, ' s')} / {_f(eval_compile, 1, ' s')} / {e.get('exit', '-')}"),
        ("eval sentences/s (wall; without compile)", per_sentence),
        ("test SacreBLEU of the short run", _f(e.get("bleu"), 2)),
        ("eval.py --translate: lines / wall / exit",
         f"{tr.get('lines', '-')} / {_f(tr.get('wall_s'), 1, ' s')} / {tr.get('exit', '-')}"),
        ("phases not run (out of the call's time)", ", ".join(s.get("skipped", [])) or "none"),
    ]
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def backend_table(backends: dict[str, dict[str, Any]]) -> str:
    """One row per attention backend's short training: finite or not, throughput, and its profile in brief."""
    rows = ["| attention backend | exit | updates | finite | tokens/s | ms per update | device busy ms | kernels "
            "| launch ms | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, b in backends.items():
        if b.get("skipped"):
            rows.append(f"| {name} | - | - | - | - | - | - | - | - | not run: {b['skipped']} |")
            continue
        prof = b.get("trace") or {}
        device = prof.get("device") == "gpu"
        finite = {True: "yes", False: "NO"}.get(b.get("finite"), "-") + f" ({b.get('logged', 0)} logged)"
        note = "" if b.get("exit") in (0, 143) else b.get("error", "")
        if prof and not device:
            note = (note + "; " if note else "") + "profile: no device tracks"
        rows.append(f"| {name} | {b.get('exit')} | {b.get('last_step', 0)} | {finite} | "
                    f"{_f(b.get('tokens_per_second'), 0)} | {_ms(b.get('seconds_per_update'))} | "
                    f"{_ms(prof.get('busy')) if device else '-'} | {_f(prof.get('kernels'), 0) if device else '-'} | "
                    f"{_ms(prof.get('launch')) if device else '-'} | {note.replace('|', '/')} |")
    return "\n".join(rows)


def decode_table(decode: dict[str, Any]) -> str:
    """The decode phase's figures: sentences/s per mode and count, compile seconds, the search batch's profile."""
    if not decode:
        return "decode: not run"
    given = ", ".join(f"{k} {v}" for k, v in decode.get("batching", {}).items()) or "sized for the devices"
    rows = [f"| decode ({given}; exit {decode.get('exit', '-')}) | sentences | sentences/s after compiling | compile s "
            "| batch: sentences, tokens |", "|---|---|---|---|---|"]
    rows += [f"| {row['mode']} | {row['sentences']} | {_f(row['sentences_per_second'], 0)} | {_f(row['compile_s'], 1)} "
             f"| {row.get('batching', {}).get('batch_size', '-')}, {row.get('batching', {}).get('batch_tokens', '-')} |"
             for row in decode.get("modes", [])]
    return "\n".join(rows + ["", *(decode.get("search_profile", {}).get("lines") or ["search profile: none"])])
