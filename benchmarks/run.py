"""The benchmark harness: one command, a printed table per section, and a JSON file.

    python benchmarks/run.py [--quick] [--sections train,e2e,widths,decode,ctranslate2,options,pipeline,split]
                             [--json PATH]

Sections:
  train    train step of ours and PyTorch's nn.Transformer (same dimensions, shared embeddings,
           label-smoothed loss, Adam), each in its own worker process, timed in alternating rounds on
           the same batch: target tokens/s, MFU against the matmul peak measured in this run, the
           ratio ours/peer, and peak memory (RSS on CPU, device memory on GPU);
  e2e      end-to-end training throughput with the input pipeline and padding (built-in corpus and a
           WMT-like length profile);
  widths   packed rows of max_length (the old default), the row width chosen from the corpus, and length
           buckets, on a short-sentence and a WMT-like length profile, alternating rounds: real target
           tokens/s, the ratio to rows of max_length, and the share of attention scores wasted;
  decode   beam-4 and greedy sentences/s against an earlier revision's decoding, alternating in
           worker processes, ours in float32 and bfloat16 on one CPU device and on one per core (as
           eval.py decodes on a CPU host; at most 8, a power of two), the earlier revision on both
           counts too, and the key/value cache's speed-up;
  ctranslate2  CTranslate2 on the same model exported, float32 and int8, one batch or parallel
           batches, against ours (ctranslate2_peer.py, in its own process);
  options  scan_layers / remat: compile time, XLA's temporary memory and step time;
  pipeline the input pipeline alone (batches/s, padding efficiency);
  split    whole-split translation of the demo run's test set (runs/demo: `make demo` first), the
           former batching against batching by source length with a token budget, then the whole
           eval.py command against the decoding issue's revision (split_speed.py).
Needs the benchmark extra for the peer: pip install -e '.[bench]' (PyTorch CPU wheel).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

# On a GPU this process (matmul peak, e2e, decode) and the train-step worker it starts share the
# device: each allocates what it uses instead of reserving 75% of the device memory at start-up,
# which would leave the second process too little. Set before JAX starts; the workers inherit it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import decode_speed
import end_to_end
import input_pipeline
import split_speed
import train_step
import workers
from train_step import Case

from transformer_jax import TransformerConfig

ON_GPU = jax.devices()[0].platform == "gpu"
SMALL = TransformerConfig(vocab_size=4000, num_layers=2, d_model=128, d_ff=512, num_heads=4, max_len=256)
BASE = TransformerConfig(vocab_size=37000)  # the paper's base model: N=6, d_model=512, d_ff=2048, h=8


def train_cases(quick: bool) -> list[Case]:
    """CPU: small config and base shapes against the peer. GPU: base in bfloat16 at ~25k tokens/step."""
    if ON_GPU:
        fast = {"dtype": "bfloat16", "attention_backend": "fused"}
        return [Case("base, bfloat16, 25,600 target tokens", BASE.replace(**fast), 200, 128, peer=False),
                Case("big, bfloat16, 25,600 target tokens", TransformerConfig.preset("big", vocab_size=37000, **fast),
                     200, 128, peer=False)]
    cases = [Case("small (N=2, d_model 128, vocab 4,000), 64 x 64", SMALL, 64, 64)]
    if not quick:
        cases.append(Case("base (N=6, d_model 512, vocab 37,000), 16 x 64", BASE, 16, 64))
    return cases


def section_train(args: argparse.Namespace, report: dict[str, Any]) -> None:
    dtype = jnp.bfloat16 if ON_GPU else jnp.float32
    peak = train_step.peak_matmul_flops(dtype)
    report["peak_matmul_flops"] = {"dtype": jnp.dtype(dtype).name, "flops_per_s": peak}
    print(f"measured peak matmul rate ({jnp.dtype(dtype).name}): {peak / 1e12:.3f} TFLOP/s")
    rows, memory_lines = [], []
    for index, case in enumerate(train_cases(args.quick)):
        started = {impl: workers.Worker([sys.executable, __file__, f"--worker={impl}:{index}"]
                                        + (["--quick"] if args.quick else []))
                   for impl in (("ours", "peer") if case.peer else ("ours",))}
        try:
            result = train_step.compare(case, started, peak, rounds=args.rounds, steps_per_round=args.steps)
        finally:
            for worker in started.values():
                worker.close()
        rows.append(result)
        line = f"{case.name:<48} ours {result['ours_tokens_per_s']:>9,.0f} tok/s  MFU {result['ours_mfu']:6.1%}"
        if case.peer:
            line += (f" | peer {result['peer_tokens_per_s']:>9,.0f} tok/s  MFU {result['peer_mfu']:6.1%}"
                     f" | ours/peer {result['ratio_ours_over_peer']:.2f}"
                     f" (rounds {min(result['round_ratios']):.2f}-{max(result['round_ratios']):.2f})")
        print(line, flush=True)
        if ON_GPU:
            days = 100_000 * 25_000 / result["ours_tokens_per_s"] / 86_400
            result["paper_base_schedule_days"] = days
            print(f"  the paper's schedule (100k steps x 25k tokens) at this rate: {days:.2f} days")
        memory_lines += [_memory_line(case, impl, result[f"{impl}_memory"]) for impl in started]
    print("memory (each contender in its own process):")
    print("\n".join(memory_lines))
    report["train"] = rows


def section_e2e(args: argparse.Namespace, report: dict[str, Any]) -> None:
    steps = 3 if args.quick else 10
    builtin = end_to_end.builtin_encoded()
    report["_builtin_corpus"] = builtin
    wmt = input_pipeline.wmt_like_corpus(100_000 if not ON_GPU else 1_000_000)
    if ON_GPU:
        cases = [("built-in corpus, base bf16", BASE.replace(vocab_size=4000, dtype="bfloat16"), builtin, 25_000, 64),
                 ("WMT-like lengths, base bf16", BASE.replace(vocab_size=32000, dtype="bfloat16"), wmt, 25_000, 256)]
    else:
        cases = [("built-in corpus, small model", SMALL, builtin, 4_096, 64),
                 ("WMT-like lengths, small model, vocab 32,000", SMALL.replace(vocab_size=32000), wmt, 8_192, 256)]
    rows = {}
    for name, config, corpus, tokens, max_length in cases:
        result = end_to_end.measure(config, corpus, tokens, max_length, steps)
        rows[name] = result
        print(f"{name:<48} {result['real_target_tokens_per_s']:>9,.0f} real target tok/s  padding efficiency "
              f"{result['padding_efficiency']:.1%}  step {result['s_per_step']:.3f}s (bare {result['bare_s_per_step']:.3f}s, "
              f"pipeline + padding {result['pipeline_overhead']:+.1%})", flush=True)
    report["e2e"] = rows


SHORT_SENTENCES = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=256)


def section_widths(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Packed rows of max_length against the width chosen from the corpus and length buckets."""
    rounds, steps = (2, 1) if args.quick else (args.rounds, args.steps)
    short = input_pipeline.wmt_like_corpus(34_000, median=10)
    wmt = input_pipeline.wmt_like_corpus(100_000 if not ON_GPU else 1_000_000)
    cases = [("short sentences (mean 12), d_model 256, N=3, 4,096 tokens", SHORT_SENTENCES, short, 4_096)]
    if ON_GPU:
        cases.append(("WMT-like (mean 27), base bf16, 25,000 tokens", BASE.replace(dtype="bfloat16"), wmt, 25_000))
    elif args.widths_base:  # the paper's base model (vocabulary 37,000) at a CPU-sized batch
        cases = [("WMT-like (mean 27), base model, 4,096 tokens", BASE, wmt, 4_096)]
    else:  # the base model's CPU steps take ~10 s each on a shared 2-core machine: the small model
        cases.append(("WMT-like (mean 27), small model, vocab 32,000, 4,096 tokens", SMALL.replace(vocab_size=32000),
                      wmt, 4_096))
    rows = {}
    for name, config, corpus, tokens in cases:
        result = end_to_end.compare_widths(config, corpus, tokens, 256, rounds, steps)
        rows[name] = result
        print(f"{name} (max_length 256, chosen row width {result['chosen_width']}):")
        for mode in end_to_end.WIDTH_MODES:
            r = result[mode]
            print(f"  {mode:<20} widths {','.join(map(str, r['widths'])):<28} {r['real_target_tokens_per_s']:>8,.0f} "
                  f"real target tok/s  x{r['ratio_over_max_length_rows']:.2f} (median of rounds)  attention "
                  f"wasted {r['wasted_attention']:.1%}", flush=True)
    report["widths"] = rows


def section_decode(args: argparse.Namespace, report: dict[str, Any]) -> None:
    split = decode_speed.split_device_count()
    result = decode_speed.run(repeats=2 if args.quick else 3, with_reference=not args.quick,
                              rounds=3 if args.quick else 7, dtypes=("", "bfloat16"),
                              devices=(1, split) if split > 1 else (1,))
    decode_speed.print_summary(result)
    report["decode"] = result


def worker_main(impl: str, case_index: int, quick: bool) -> None:
    """A train-step worker process (see workers.py) for one contender and case."""
    case = train_cases(quick)[case_index]
    baseline = workers.peak_rss_bytes()

    def build():
        if impl == "peer":
            from peer_torch import peer_train_step

            return peer_train_step(case.config, case.batch())
        return train_step.our_train_step(case.config, case.batch())

    def memory() -> dict[str, Any]:
        result = {"peak_rss_bytes": workers.peak_rss_bytes(), "rss_after_imports_bytes": baseline}
        if ON_GPU and impl == "ours":
            result["peak_device_bytes"] = jax.devices()[0].memory_stats()["peak_bytes_in_use"]
        return result

    workers.serve(build, memory)


def _memory_line(case: Case, impl: str, memory: dict[str, Any]) -> str:
    if "peak_device_bytes" in memory:
        figure = f"peak device memory {memory['peak_device_bytes'] / 2**30:.2f} GiB"
    else:
        above = (memory["peak_rss_bytes"] - memory["rss_after_imports_bytes"]) / 2**20
        figure = f"peak RSS {memory['peak_rss_bytes'] / 2**20:,.0f} MiB ({above:,.0f} MiB above the imports)"
    return f"{case.name:<48} {impl:<5} {figure}"


def section_options(args: argparse.Namespace, report: dict[str, Any]) -> None:
    case = train_cases(args.quick)[-1]
    batch = jax.device_put(train_step.synthetic_batch(case.rows, case.length, case.config.vocab_size))
    rows = []
    for scan in (False, True):
        for remat in ("none", "dots", "full"):
            config = case.config.replace(scan_layers=scan, remat=remat)
            result = train_step.compile_and_time(config, batch, steps=2 if args.quick else 3)
            result.update(scan_layers=scan, remat=remat)
            rows.append(result)
            print(f"{case.name:<48} scan_layers={scan!s:<5} remat={remat:<4}  compile {result['compile_s']:5.1f} s  "
                  f"XLA temp memory {result['temp_bytes'] / 2**20:8,.0f} MiB  step {result['s_per_step']:.3f} s", flush=True)
    report["options"] = rows


def section_pipeline(args: argparse.Namespace, report: dict[str, Any]) -> None:
    builtin = report.get("_builtin_corpus") or end_to_end.builtin_encoded()
    report["pipeline"] = input_pipeline.run(1.0 if args.quick else 5.0, builtin)


def section_ctranslate2(args: argparse.Namespace, report: dict[str, Any]) -> None:
    # Its own process: ours runs on one CPU device per core there (its default), fixed when JAX starts.
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "ct2.json")
        subprocess.run([sys.executable, os.path.join(HERE, "ctranslate2_peer.py"), f"--rounds={3 if args.quick else 7}",
                        f"--json={path}"], check=True)
        with open(path) as f:
            report["ctranslate2"] = json.load(f)


def section_split(args: argparse.Namespace, report: dict[str, Any]) -> None:
    report["split"] = split_speed.run("runs/demo", sentences=400 if args.quick else 0, rounds=1 if args.quick else 3)
    if not args.quick:  # the whole eval.py command, as a user runs it, against the decoding issue's revision
        report["split"]["eval_py"] = split_speed.compare_cli("runs/demo", decode_speed.BASELINE_REVISION, 3, (),
                                                             ("bfloat16",))


SECTIONS = {"train": section_train, "e2e": section_e2e, "widths": section_widths, "decode": section_decode,
            "ctranslate2": section_ctranslate2, "options": section_options, "pipeline": section_pipeline,
            "split": section_split}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, from: " + ", ".join(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps (a smoke run)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timing rounds per train case")
    parser.add_argument("--steps", type=int, default=2, help="steps per framework per round")
    parser.add_argument("--json", default=None, help="write all results here")
    parser.add_argument("--widths_base", action="store_true",
                        help="widths section: only the WMT-like profile, with the base model (on CPU too)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        impl, index = args.worker.split(":")
        worker_main(impl, int(index), args.quick)
        return
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {list(SECTIONS)}")
    device = jax.devices()[0]
    report: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "device": f"{device.device_kind} ({device.platform})",
        "device_count": jax.device_count(), "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "jax": jax.__version__, "python": platform.python_version(),
    }
    print(" | ".join(f"{k} {v}" for k, v in report.items()))
    for name in args.sections.split(","):
        start = time.perf_counter()
        print(f"\n== {name} ==", flush=True)
        SECTIONS[name](args, report)
        report.setdefault("section_seconds", {})[name] = time.perf_counter() - start
    report.pop("_builtin_corpus", None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=float)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
