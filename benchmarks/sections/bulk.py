"""Bulk translation (`transformer-jax translate-corpus`): what resumability costs, and memory against input size.

The model is the demo's architecture (N=2, d_model 128, d_ff 512, h=4) after two updates on the built-in corpus
(its outputs run on to the length limit: input length + 8 tokens here), the input the built-in corpus's English
side (synthetic sentences of 4 to about 40 tokens). Each job is the library call the command makes
(`evaluation.corpus_translation.translate_corpus` with a `Translator`), in a worker process of its own, its
compiles done by a first job on other lines:
- **overhead**: the job's wall time against the time inside `Translator.translate` (encoding, decoding,
  detokenizing); the rest is reading and cutting the input into shards, writing each shard whole (with its
  counts) and joining the shards into the output; shards of 2,000 lines, greedy, float32;
- **modes**: sentences/s of the whole job for greedy, beam 4 and sampling (top-k 10) in float32, and greedy and
  beam 4 in bfloat16;
- **memory**: the worker's peak resident memory (VmHWM) translating N and 8N lines (greedy): flat in the input
  size if the input is streamed.
CTranslate2 and transformers on the same weights: the opus_mt and ctranslate2 sections.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from typing import Any

from benchmarks.workers import PREFIX, REPO, peak_rss_bytes, worker_command

MODES = {"greedy, float32": ("greedy", "float32"), "beam 4, float32": ("beam", "float32"),
         "sample top-k 10, float32": ("sample", "float32"), "greedy, bfloat16": ("greedy", "bfloat16"),
         "beam 4, bfloat16": ("beam", "bfloat16")}


def make_run(workdir: str) -> None:
    """A run of the demo's architecture, two updates on the built-in corpus."""
    from configs.smoke import get_config
    from transformer_jax.run import Trainer, assemble_run

    config = get_config()
    config.data.update(builtin_train_size=4000, vocab_size=1000, tokenizer_sample_size=8000, tokens_per_batch=2048)
    config.model.update(num_layers=2, d_model=128, d_ff=512, num_heads=4)
    config.training.update(num_train_steps=2, warmup_steps=1, eval_every=2, checkpoint_every=2)
    config.eval.update(beam_size=4, max_extra_length=8)
    trainer = Trainer(assemble_run(config, workdir))
    trainer.run()
    trainer.close()


def write_input(path: str, lines: int, seed: int) -> None:
    from transformer_jax.data import generate_pairs

    with open(path, "w") as f:
        f.writelines(source + "\n" for source, _ in generate_pairs(lines, seed=seed))


def worker(spec: dict[str, Any]) -> None:
    """One job after a warm-up job on other lines; prints its wall time, the time inside translate and its peak RSS."""
    from transformer_jax.evaluation import Translator, corpus_translation

    translator = Translator(spec["workdir"], dtype=spec["dtype"])
    inside = [0.0]
    translate = translator.translate

    def timed(*args: Any, **kwargs: Any) -> list[str]:
        start = time.perf_counter()
        try:
            return translate(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - start

    translator.translate = timed
    search = {"mode": spec["mode"], "top_k": 10 if spec["mode"] == "sample" else None}
    settings = {"spec": spec}
    for name in ("warm", "timed"):
        files = corpus_translation.plan_files([spec[f"{name}_input"]], spec["output_dir"], name)
        inside[0] = 0.0
        start = time.perf_counter()
        corpus_translation.translate_corpus(translator, files, settings, search, shard_lines=spec["shard_lines"],
                                            say=lambda line: None)
        wall = time.perf_counter() - start
    lines = spec["lines"]
    print(PREFIX + json.dumps({"wall_s": wall, "translate_s": inside[0], "sentences_per_s": lines / wall,
                               "peak_rss_bytes": peak_rss_bytes()}), flush=True)


def job(workdir: str, directory: str, lines: int, mode: str, dtype: str, shard_lines: int) -> dict[str, Any]:
    warm, timed = os.path.join(directory, f"warm{lines}.en"), os.path.join(directory, f"input{lines}.en")
    if not os.path.exists(timed):
        write_input(warm, min(lines, 2 * shard_lines), seed=1)
        write_input(timed, lines, seed=2)
    out = tempfile.mkdtemp(dir=directory)
    spec = {"workdir": workdir, "mode": mode, "dtype": dtype, "lines": lines, "shard_lines": shard_lines,
            "warm_input": warm, "timed_input": timed, "output_dir": out}
    done = subprocess.run(worker_command("bulk", spec), cwd=REPO, capture_output=True, text=True, check=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith(PREFIX))[len(PREFIX):])


def run(args: argparse.Namespace) -> dict[str, Any]:
    lines, shard_lines = (1_000, 500) if args.quick else (args.bulk_lines, 2_000)
    directory = tempfile.mkdtemp(prefix="bulk-bench-")
    workdir = os.path.join(directory, "run")
    make_run(workdir)
    results: dict[str, Any] = {"lines": lines, "shard_lines": shard_lines}
    print(f"{lines} lines, shards of {shard_lines}")
    print(f"{'job':<28} {'sentences/s':>12} {'wall s':>8} {'in translate s':>15} {'overhead':>9} {'peak RSS MB':>12}")
    for name, (mode, dtype) in MODES.items():
        figures = job(workdir, directory, lines, mode, dtype, shard_lines)
        figures["overhead"] = figures["wall_s"] / figures["translate_s"] - 1
        results[name] = figures
        print(f"{name:<28} {figures['sentences_per_s']:>12.1f} {figures['wall_s']:>8.1f} "
              f"{figures['translate_s']:>15.1f} {100 * figures['overhead']:>8.2f}% "
              f"{figures['peak_rss_bytes'] / 1e6:>12.0f}", flush=True)
    big = job(workdir, directory, 8 * lines, "greedy", "float32", shard_lines)
    results["memory"] = {"lines": [lines, 8 * lines], "peak_rss_bytes": [results["greedy, float32"]["peak_rss_bytes"],
                                                                         big["peak_rss_bytes"]]}
    growth = big["peak_rss_bytes"] / results["greedy, float32"]["peak_rss_bytes"] - 1
    print(f"peak RSS, greedy float32: {lines} lines {results['greedy, float32']['peak_rss_bytes'] / 1e6:.0f} MB, "
          f"{8 * lines} lines {big['peak_rss_bytes'] / 1e6:.0f} MB ({100 * growth:+.1f}%); "
          f"{8 * lines} lines at {big['sentences_per_s']:.1f} sentences/s, overhead "
          f"{100 * (big['wall_s'] / big['translate_s'] - 1):.2f}%")
    results["memory"]["growth"] = growth
    return results
