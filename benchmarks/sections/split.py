"""Whole-split translation: a trained run's test split, translated by the library with the run's batching and with
budgets of source token slots; then the whole eval.py command as a user runs it, with the flags that change its cost.

The model is a trained run's last checkpoint (`--split_workdir`, by default the demo's: `make demo`
writes runs/demo), so sentences end on EOS, or run on to the length limit, as a real evaluation's do.
Library contenders, on one device, timed in alternating rounds on the same sentences with the run's
search settings (beam 4, alpha 0.6), `translate_encoded` sorting and bucketing by source length with one batch
in flight:
- "by source": the run's batch_size sentences a batch;
- "by source, N tokens": a budget of N source token slots per batch (`--split_batch_tokens`).
Each contender translates once before the rounds (compiles every shape it uses; timed apart); the
figures are medians over the rounds, with the ratio to "by source" and the sentences that differ from it.

Then (not with --quick) the whole `eval.py --checkpoint=latest` command (start-up, compiles, translation, loss
and scores): the run's settings, --cpu_devices=1, --dtype=bfloat16, each without the compilation cache, and the
run's settings with the cache filled, in alternating rounds on copies of the run; the hypotheses files are
compared with the run's settings'. The comparisons with the former batching and with revision bfce298's eval.py
are in docs/benchmarks/history.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import jax
import numpy as np

from benchmarks.workers import REPO
from transformer_jax import DecodeOptions, TransformerConfig
from transformer_jax.base import workdir as layout
from transformer_jax.checkpoints import checkpoint_params, open_run
from transformer_jax.config import decode_options, translation_batching
from transformer_jax.data import EncodedPairs, Tokenizer, TranslationBatching, eval_set, load_run_splits
from transformer_jax.evaluation import translate_encoded

ROUNDS = 3
Translator = Callable[[], list[str]]


def contenders(params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
               options: DecodeOptions, batching: TranslationBatching, batch_tokens: list[int]) -> dict[str, Translator]:
    """Name -> a call translating `encoded` one way (`batching`: the run's)."""
    def ours(tokens: int) -> Translator:
        return lambda: translate_encoded(params, config, encoded, tokenizer, options,
                                         batching=batching.replace(batch_tokens=tokens), show_progress=False)

    result = {"by source": ours(0)}
    result.update({f"by source, {tokens} tokens": ours(tokens) for tokens in batch_tokens})
    return result


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of `call()`, and what it returned."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def alternate(names: list[str], rounds: int, run_one: Callable[[str], float]) -> dict[str, list[float]]:
    """Seconds per round of each contender, `run_one(name)` timing one run; the order reverses every round."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            times[name].append(run_one(name))
        print(f"  round {round_index + 1}: " + ", ".join(f"{n} {times[n][-1]:.1f} s" for n in names), flush=True)
    return times


def measure(translators: dict[str, Translator], rounds: int) -> dict[str, Any]:
    """First-call and per-round wall times of each translator, alternating; ratios and outputs against the first."""
    first, outputs = {}, {}
    for name, translate in translators.items():
        first[name], outputs[name] = timed(translate)
        print(f"  {name:<28} first call (with compiles) {first[name]:7.1f} s", flush=True)
    times = alternate(list(translators), rounds, lambda name: timed(translators[name])[0])
    reference = next(iter(translators))
    return {name: {"first_call_s": first[name], "round_s": times[name], "median_s": statistics.median(times[name]),
                   "speedup": statistics.median(times[reference]) / statistics.median(times[name]),
                   "sentences_differing": sum(a != b for a, b in zip(outputs[name], outputs[reference]))}
            for name in translators}


def compare_library(workdir: str, sentences: int, rounds: int, batch_tokens: tuple[int, ...]) -> dict[str, Any]:
    """Translate the test split of `workdir`'s run (its first `sentences`; 0: all) with every contender."""
    if not os.path.isfile(layout.run_path(workdir, layout.CONFIG)):
        raise SystemExit(f"{workdir} holds no trained run; train one first (make demo) or pass --split_workdir")
    trained = open_run(workdir)
    try:
        step = trained.checkpointer.steps()[-1]
        params = checkpoint_params(trained, [step])
    finally:
        trained.checkpointer.close()
    pairs = load_run_splits(trained.config.data, trained.config.training.seed, ("test",))["test"]
    encoded = eval_set(pairs, trained.tokenizer).encoded
    if sentences:
        encoded = encoded.select(np.arange(min(sentences, len(encoded))))
    options, batching = decode_options(trained.config), translation_batching(trained.config)
    print(f"{workdir} step {step}: {len(encoded)} test sentences, {options.describe()}, batch_size "
          f"{batching.batch_size}; {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs", flush=True)
    result = measure(contenders(params, trained.model_config, encoded, trained.tokenizer, options, batching,
                                list(batch_tokens)), rounds)
    for name, figures in result.items():
        print(f"{name:<28} median {figures['median_s']:7.1f} s  {len(encoded) / figures['median_s']:6.1f} sentences/s"
              f"  / by source {figures['speedup']:.2f}x"
              f"  (rounds {', '.join(f'{t:.1f}' for t in figures['round_s'])} s;"
              f" first call {figures['first_call_s']:.1f} s)"
              f"  sentences differing from by source: {figures['sentences_differing']}")
    return {"workdir": workdir, "step": step, "sentences": len(encoded), "rounds": rounds,
            "batch_size": batching.batch_size, "contenders": result}


def run_eval(workdir: str, flags: list[str]) -> tuple[float, dict[str, Any], bytes]:
    """Wall seconds of one eval.py run with `flags`, its scores and its hypotheses file (the eval/ folder is cleared
    first)."""
    evaluations = layout.run_path(workdir, layout.EVAL)
    shutil.rmtree(evaluations, ignore_errors=True)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    command = [sys.executable, "eval.py", f"--workdir={workdir}", "--checkpoint=latest", *flags]
    seconds, _ = timed(lambda: subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True))
    [scores] = [f for f in os.listdir(evaluations) if f.endswith(".json")]
    [hypotheses] = [f for f in os.listdir(evaluations) if f.endswith(".hyp")]
    with open(os.path.join(evaluations, scores)) as f, open(os.path.join(evaluations, hypotheses), "rb") as h:
        return seconds, json.load(f), h.read()


def compare_cli(workdir: str, rounds: int, batch_tokens: tuple[int, ...],
                dtypes: tuple[str, ...] = ()) -> dict[str, Any]:
    """This tree's eval.py with the run's settings, one CPU device, each token budget and each of `dtypes` (no
    compilation cache), and with its compilation cache filled, alternating; ratios to the run's settings."""
    with tempfile.TemporaryDirectory() as scratch:
        # Every contender but the last compiles every program (no cache); the last loads them from a cache filled
        # before the rounds (a later eval.py of the same shapes).
        cold = "--compilation_cache="
        runs: dict[str, list[str]] = {"eval.py": [cold], "eval.py, one CPU device": [cold, "--cpu_devices=1"]}
        runs.update({f"eval.py, {t} tokens": [cold, f"--batch_tokens={t}"] for t in batch_tokens})
        runs.update({f"eval.py, {dtype}": [cold, f"--dtype={dtype}"] for dtype in dtypes})
        warm = [f"--compilation_cache={os.path.join(scratch, layout.COMPILATION_CACHE)}"]
        runs["eval.py, cache filled"] = warm
        copies = {}
        for name in runs:
            copies[name] = os.path.join(scratch, f"run{len(copies)}")
            shutil.copytree(workdir, copies[name], ignore=shutil.ignore_patterns(layout.EVAL, layout.LOCK))
        run_eval(copies[list(runs)[-1]], warm)  # fills the cache
        results: dict[str, Any] = {}

        def one_eval(name: str) -> float:
            seconds, *results[name] = run_eval(copies[name], runs[name])
            return seconds

        times = alternate(list(runs), rounds, one_eval)
    first = next(iter(runs))
    summary = {}
    for name in runs:
        scores, hypotheses = results[name]
        summary[name] = {"round_s": times[name], "median_s": statistics.median(times[name]),
                         "speedup": statistics.median(times[first]) / statistics.median(times[name]),
                         "bleu": scores["bleu"], "same_hypotheses": hypotheses == results[first][1]}
        figures = summary[name]
        print(f"{name:<32} median {figures['median_s']:6.1f} s  / {first} {figures['speedup']:.2f}x"
              f"  BLEU {scores['bleu']:.2f}  same hypotheses as {first}: {figures['same_hypotheses']}", flush=True)
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The library's batchings, then (not with --quick) the eval.py command's."""
    rounds = 1 if args.quick else args.rounds or ROUNDS
    budgets = tuple(int(t) for t in args.split_batch_tokens.split(",") if t)
    result = compare_library(args.split_workdir, 400 if args.quick else 0, rounds, budgets)
    if not args.quick:
        result["eval_py"] = compare_cli(args.split_workdir, rounds, (), ("bfloat16",))
    return result
