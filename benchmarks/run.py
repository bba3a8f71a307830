"""The benchmark harness: one command, a printed table per section, and one JSON file for all of them.

    python -m benchmarks.run [--sections train,e2e,...|all] [--quick] [--rounds N] [--json PATH]

Run it from the repository root. The default sections run on a CPU host in about 10 minutes; `all`
adds the others (see SECTIONS). Each section is a module of benchmarks/sections/ whose
docstring says what it times and how; BENCHMARKS.md holds the figures, benchmarks/results/INDEX.md the
raw output behind them. Needs the `bench` extra for the train section's peer (PyTorch CPU wheel).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import time
from types import ModuleType
from typing import Any

# On a GPU this process and the workers it starts share the device: each allocates what it uses instead
# of reserving 75% of the device memory at start-up. Set before JAX starts; the workers inherit it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

SECTIONS = {
    "train": "train step of ours and PyTorch's nn.Transformer, alternating worker processes: tokens/s, MFU, memory",
    "e2e": "training throughput with the input pipeline and padding (built-in corpus, WMT-like lengths)",
    "widths": "packed rows of max_length, the row width chosen from the corpus, and length buckets",
    "decode": "beam-4 and greedy sentences/s, float32 and bfloat16, on one CPU device and one per core; the key/value "
              "cache's speed-up",
    "ctranslate2": "CTranslate2 on the same model exported, float32 and int8, against ours",
    "options": "scan_layers / remat: compile time, XLA's temporary memory and step time",
    "pipeline": "the input pipeline alone: batches/s, padding efficiency",
    "split": "translating the demo run's test split (runs/demo: make demo first) by batching, and eval.py's command",
    "startup": "start-up time and peak memory of a run's data preparation on a 1M-pair text corpus; train.py's "
               "launch to first update (base sizes) with a cold and a warm compile cache and on resume",
    "input": "one process's batches on one core against the update's roofline; memory and start-up at 1M-10M "
             "prepared pairs; preparing pairs/s",
    "tile_widths": "packed row widths around the TPU's 128 lanes: the base train step's HBM bytes per slot (libtpu)",
    "aot": "the paper's models compiled for TPU topologies and H100s on this host: memory, FLOPs, rooflines",
    "loop": "host time of train.py's loop on real batches against the compiled step alone, part by part "
            "(--loop_corpus DIR: train/dev/test.en/.de files; default the built-in corpus)",
    "preemption": "the bound on the host's lead (training.max_updates_in_flight): tokens/s with and without it (1 and "
                  "2 processes), train.py's SIGTERM-to-checkpoint seconds at updates of 0.1-2 s against no bound, and "
                  "the train step compiled for TPU/GPU (no host transfer inside)",
    "opus_mt": "an OPUS-MT-sized Marian model translating 1,000 sentences: ours (float32, bfloat16) against transformers' "
               "generate and CTranslate2 on the same weights; the compiled search's roofline on v5e-8 and an H100",
    "time_to_bleu": "the same model and recipe trained for the same wall time by fairseq 0.12 (its own venv: "
                    "--fairseq_venv) and by us, test SacreBLEU, updates and target tokens/s",
    "bulk": "translate-corpus: the cost of resumability (shard writes) against decoding, sentences/s by mode and "
            "dtype, peak memory at N and 8N input lines",
    "checkpoint_stall": "how long a checkpoint save holds the training thread against the state's size (10-800 MB)",
    "search_kernels": "the beam and greedy searches compiled for H100/H200 without a GPU: kernels and conditionals "
                      "per decoding step, peak memory, compile seconds",
    "accelerators": "our train step against the Flax WMT example's compiled for TPU v5e-8 / v5p-8 and H100 (HBM bytes, "
                    "peak memory, largest batch), timed where this host has the chip (--flax_checkout)",
}
DEFAULT_SECTIONS = ("train", "e2e", "widths", "decode", "ctranslate2", "options", "pipeline", "split")


def section(name: str) -> ModuleType:
    """The module of one section (imported when used: a section's imports stay out of the others' runs)."""
    return importlib.import_module(f"benchmarks.sections.{name}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The harness's flags: which sections, how long, where the JSON goes, and a few per section."""
    listing = "\n".join(f"  {name:<12} {text}" for name, text in SECTIONS.items())
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawTextHelpFormatter,
                                     epilog=f"sections (default: {','.join(DEFAULT_SECTIONS)}):\n{listing}")
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS), help="comma-separated section names, or all")
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating timing rounds (default: each section's)")
    parser.add_argument("--steps", type=int, default=2, help="train, widths: steps per contender per round")
    parser.add_argument("--json", default=None, help="write every section's figures here")
    parser.add_argument("--widths_base", action="store_true",
                        help="widths: only the WMT-like profile, with the base model (on CPU too)")
    parser.add_argument("--split_workdir", default="runs/demo",
                        help="split: a trained run (make demo writes runs/demo)")
    parser.add_argument("--split_batch_tokens", default="256",
                        help="split: comma-separated source token budgets to time besides the run's own")
    parser.add_argument("--startup_pairs", type=int, default=1_000_000, help="startup: training pairs generated")
    parser.add_argument("--input_pairs", default=None,
                        help="input: comma-separated prepared corpus sizes (default 1000000,4500000,10000000; "
                             "--quick 100000)")
    parser.add_argument("--input_text_pairs", type=int, default=None,
                        help="input: text pairs prepared for pairs/s (default 200000; --quick 20000)")
    parser.add_argument("--input_batches", type=int, default=None,
                        help="input: batches timed per feed (default 200; --quick 50)")
    parser.add_argument("--tile_topology", default="v5e:2x4", help="tile_widths: the TPU topology compiled for")
    parser.add_argument("--aot_models", default="base,big", help="aot: configs/wmt14_ende_<model>.py to compile")
    parser.add_argument("--aot_topologies", default="v5e-8,v5e-256,v4-128,v5p-128,v6e-64",
                        help="aot: TPU topologies or GPUs (h100, h100-8: needs jax[cuda12])")
    parser.add_argument("--aot_reports", default=None,
                        help="aot: also write each compile's full report here, {model} and {topology} filled in")
    parser.add_argument("--flax_checkout", default=None,
                        help="accelerators: a local google/flax checkout (its examples/wmt is the peer)")
    parser.add_argument("--accel_runs", default="base@v5e-8,big@v5p-8,base@h100",
                        help="accelerators: model@topology compiled ('' for none: the device timings alone)")
    parser.add_argument("--accel_contenders", default="",
                        help="accelerators: the train steps compiled, separated by ';' (default: all; the ratios need "
                             "'flax'; the beam searches are compiled only with all)")
    parser.add_argument("--accel_timed_rows", default="12,96",
                        help="accelerators: rows of 256 tokens per update timed on this host's GPU/TPU")
    parser.add_argument("--loop_corpus", default=None, help="loop: train/dev/test.en/.de files (default: built-in)")
    parser.add_argument("--loop_steps", type=int, default=100, help="loop: updates timed per model")
    parser.add_argument("--fairseq_venv", default=None, help="time_to_bleu: a virtualenv with fairseq 0.12.2")
    parser.add_argument("--bleu_minutes", type=float, default=30.0, help="time_to_bleu: wall time each side trains")
    parser.add_argument("--bleu_at", default="5,10",
                        help="time_to_bleu: minutes (comma-separated) at which test BLEU is also read (and at the end)")
    parser.add_argument("--our_tokens_per_batch", type=int, default=4096,
                        help="time_to_bleu: our data.tokens_per_batch (fairseq's --max-tokens stays 4096)")
    parser.add_argument("--bleu_corpus", default=None,
                        help="time_to_bleu: train/dev/test.en/.de files (default: the built-in corpus)")
    parser.add_argument("--bulk_lines", type=int, default=20_000, help="bulk: input lines a job translates")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker_spec", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sections = list(SECTIONS) if args.sections == "all" else args.sections.split(",")
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)} or all")
    return args


def machine() -> dict[str, Any]:
    """The date, device, CPU and versions every result is read against."""
    import jax

    device = jax.devices()[0]
    return {"date": datetime.date.today().isoformat(), "device": f"{device.device_kind} ({device.platform})",
            "device_count": jax.device_count(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "jax": jax.__version__, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:  # a process a section started (see workers.worker_command)
        section(args.worker).worker(json.loads(args.worker_spec))
        return
    report: dict[str, Any] = machine()
    print(" | ".join(f"{key} {value}" for key, value in report.items()))
    for name in args.sections:
        start = time.perf_counter()
        print(f"\n== {name} ==", flush=True)
        report[name] = section(name).run(args)
        report.setdefault("section_seconds", {})[name] = time.perf_counter() - start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=float)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    if not __package__:  # run as a file, the sections (benchmarks.sections) cannot be imported
        raise SystemExit("run the harness from the repository root as: python -m benchmarks.run ...")
    main()
