"""Whole-split translation: a trained run's test split, translated by the library with the former batching and
with batching by source length; then the whole eval.py command against an earlier revision's.

The model is a trained run's last checkpoint (`--split_workdir`, by default the demo's: `make demo`
writes runs/demo), so sentences end on EOS, or run on to the length limit, as a real evaluation's do.
Library contenders, on one device, timed in alternating rounds on the same sentences with the run's
search settings (beam 4, alpha 0.6):
- "today": the former path, kept here as the peer: batches of the run's batch_size sentences grouped by
  max(source, target) length (`eval_batches`), each batch fetched before the next is dispatched;
- "by source": `translate_encoded` with batch_size sentences a batch (sorted and bucketed by source
  length only, one batch in flight);
- "by source, N tokens": the same with a budget of N source token slots per batch (`--split_batch_tokens`).
Each contender translates once before the rounds (compiles every shape it uses; timed apart); the
figures are medians over the rounds, and the sentences that differ from "today" are counted.

Then (not with --quick) the whole `eval.py --checkpoint=latest` command, as a user runs it (start-up,
compiles, translation, loss and scores), of `--baseline` (extracted with `git archive`) and of this tree:
its run's settings, --cpu_devices=1, --dtype=bfloat16, and with its compilation cache filled, in
alternating rounds on copies of the run; the hypotheses files are compared with the baseline's.
"""

from __future__ import annotations

import argparse
import functools
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
from transformer_jax.data import (
    EncodedPairs,
    Tokenizer,
    TranslationBatching,
    eval_batches,
    eval_set,
    load_run_splits,
    restore_order,
)
from transformer_jax.decoding import translate_batch
from transformer_jax.evaluation import translate_encoded
from transformer_jax.model import EOS_ID, PAD_ID

ROUNDS = 3
Translator = Callable[[], list[str]]


@functools.partial(jax.jit, static_argnames=("config", "options"))
def search(params: Any, src_BxS: jax.Array, rng: jax.Array, config: TransformerConfig,
           options: DecodeOptions) -> jax.Array:
    """One batch's search on one device (the peer's)."""
    return translate_batch(params, config, src_BxS, options, rng)


def translate_today(params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
                    options: DecodeOptions, batch_size: int) -> list[str]:
    """The former `translate_encoded` on one device: batches by max(source, target), fetched one by one."""
    rng = jax.random.key(options.seed)
    outputs, indices = [], []
    for batch in eval_batches(encoded, batch_size):
        rng, key = jax.random.split(rng)
        src = batch["inputs"][:, :config.max_len].copy()  # sources longer than the model keep their EOS
        src[(batch["inputs"] != PAD_ID).sum(1) > config.max_len, -1] = EOS_ID
        ids = np.asarray(search(params, src, key, config, options))
        outputs.extend(" ".join(text.splitlines()) for text in tokenizer.decode_batch(ids))
        indices.extend(batch["index"].tolist())
    ordered = restore_order(outputs, indices, len(encoded))
    return ["" if length <= 1 else text for text, length in zip(ordered, encoded.source.lengths)]


def contenders(params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
               options: DecodeOptions, batching: TranslationBatching, batch_tokens: list[int]) -> dict[str, Translator]:
    """Name -> a call translating `encoded` one way (`batching`: the run's)."""
    def ours(tokens: int) -> Translator:
        return lambda: translate_encoded(params, config, encoded, tokenizer, options,
                                         batching=batching.replace(batch_tokens=tokens), show_progress=False)

    result = {"today": lambda: translate_today(params, config, encoded, tokenizer, options, batching.batch_size),
              "by source": ours(0)}
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
    """First-call and per-round wall times of each translator, alternating; outputs compared with "today"."""
    first, outputs = {}, {}
    for name, translate in translators.items():
        first[name], outputs[name] = timed(translate)
        print(f"  {name:<28} first call (with compiles) {first[name]:7.1f} s", flush=True)
    times = alternate(list(translators), rounds, lambda name: timed(translators[name])[0])
    reference = outputs["today"]
    return {name: {"first_call_s": first[name], "round_s": times[name], "median_s": statistics.median(times[name]),
                   "speedup_over_today": statistics.median(times["today"]) / statistics.median(times[name]),
                   "sentences_differing_from_today": sum(a != b for a, b in zip(outputs[name], reference))}
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
              f"  speed-up over today {figures['speedup_over_today']:.2f}x"
              f"  (rounds {', '.join(f'{t:.1f}' for t in figures['round_s'])} s;"
              f" first call {figures['first_call_s']:.1f} s)"
              f"  sentences differing from today: {figures['sentences_differing_from_today']}")
    return {"workdir": workdir, "step": step, "sentences": len(encoded), "rounds": rounds,
            "batch_size": batching.batch_size, "contenders": result}


# (tree, eval.py flags beyond --workdir and --checkpoint; "--compilation_cache=" unless the contender uses one).
EvalContender = tuple[str, list[str]]


def run_eval(workdir: str, contender: EvalContender) -> tuple[float, dict[str, Any], bytes]:
    """Wall seconds of one eval.py run, its scores and its hypotheses file (the eval/ folder is cleared first)."""
    tree, flags = contender
    evaluations = layout.run_path(workdir, layout.EVAL)
    shutil.rmtree(evaluations, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    command = [sys.executable, os.path.join(tree, "eval.py"), f"--workdir={workdir}", "--checkpoint=latest", *flags]
    seconds, _ = timed(lambda: subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True))
    [scores] = [f for f in os.listdir(evaluations) if f.endswith(".json")]
    [hypotheses] = [f for f in os.listdir(evaluations) if f.endswith(".hyp")]
    with open(os.path.join(evaluations, scores)) as f, open(os.path.join(evaluations, hypotheses), "rb") as h:
        return seconds, json.load(f), h.read()


# Run-config keys added after the baseline revision, left out of its copy of the run (whose eval.py would
# reject them): float32_dot_outputs is False in a trained run's config, and that revision batched by sentences.
KEYS_AFTER_BASELINE = {"model": ("float32_dot_outputs",), "eval": ("batch_tokens", "dtype")}


def without_newer_keys(workdir: str) -> None:
    """Drop KEYS_AFTER_BASELINE from the run config in `workdir` (a copy for the baseline revision)."""
    path = layout.run_path(workdir, layout.CONFIG)
    with open(path) as f:
        config = json.load(f)
    for section, keys in KEYS_AFTER_BASELINE.items():
        for key in keys:
            config.get(section, {}).pop(key, None)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def compare_cli(workdir: str, revision: str, rounds: int, batch_tokens: tuple[int, ...],
                dtypes: tuple[str, ...] = ()) -> dict[str, Any]:
    """eval.py of `revision` against this tree's eval.py (the run's settings, one CPU device, each token budget,
    each of `dtypes`, and with its compilation cache filled), alternating."""
    repo = str(REPO)
    with tempfile.TemporaryDirectory() as scratch:
        old_tree = os.path.join(scratch, "before")
        os.makedirs(old_tree)
        archive = subprocess.run(["git", "-C", repo, "archive", revision], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        # Today's runs compile every program (no cache), as the old revision does; the last contender
        # loads them from a cache filled before the rounds (a later eval.py of the same shapes).
        cold = "--compilation_cache="
        runs: dict[str, EvalContender] = {f"eval.py of {revision}": (old_tree, []),
                                          "eval.py today": (repo, [cold]),
                                          "eval.py today, one CPU device": (repo, [cold, "--cpu_devices=1"])}
        runs.update({f"eval.py today, {t} tokens": (repo, [cold, f"--batch_tokens={t}"]) for t in batch_tokens})
        runs.update({f"eval.py today, {dtype}": (repo, [cold, f"--dtype={dtype}"]) for dtype in dtypes})
        warm = (repo, [f"--compilation_cache={os.path.join(scratch, layout.COMPILATION_CACHE)}"])
        runs["eval.py today, cache filled"] = warm
        copies = {}
        for name in runs:
            copies[name] = os.path.join(scratch, f"run{len(copies)}")
            shutil.copytree(workdir, copies[name], ignore=shutil.ignore_patterns(layout.EVAL, layout.LOCK))
        without_newer_keys(copies[f"eval.py of {revision}"])
        run_eval(copies[list(runs)[-1]], warm)  # fills the cache
        results: dict[str, Any] = {}

        def one_eval(name: str) -> float:
            seconds, *results[name] = run_eval(copies[name], runs[name])
            return seconds

        times = alternate(list(runs), rounds, one_eval)
    before = f"eval.py of {revision}"
    summary = {}
    for name in runs:
        scores, hypotheses = results[name]
        summary[name] = {"round_s": times[name], "median_s": statistics.median(times[name]),
                         "speedup_over_before": statistics.median(times[before]) / statistics.median(times[name]),
                         "bleu": scores["bleu"], "same_hypotheses_as_before": hypotheses == results[before][1]}
        figures = summary[name]
        print(f"{name:<46} median {figures['median_s']:6.1f} s  speed-up {figures['speedup_over_before']:.2f}x"
              f"  BLEU {scores['bleu']:.2f}  same hypotheses as {revision}: {figures['same_hypotheses_as_before']}",
              flush=True)
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The library comparison, then (not with --quick) eval.py against the baseline revision."""
    rounds = 1 if args.quick else args.rounds or ROUNDS
    budgets = tuple(int(t) for t in args.split_batch_tokens.split(",") if t)
    result = compare_library(args.split_workdir, 400 if args.quick else 0, rounds, budgets)
    if not args.quick and args.baseline:
        result["eval_py"] = compare_cli(args.split_workdir, args.baseline, rounds, (), ("bfloat16",))
    return result
