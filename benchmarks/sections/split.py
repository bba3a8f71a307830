"""Whole-split translation: wall time of translating a trained run's test split, before and after
batching by source length with a token budget (a section of benchmarks/run.py, or run alone).

    python benchmarks/split_speed.py [--workdir=runs/demo] [--sentences=0] [--rounds=3] [--batch_tokens=256]

The model is a trained run's last checkpoint (by default the demo's: `make demo` writes runs/demo),
so sentences end on EOS, or run on to the length limit, as a real evaluation's do. Contenders, timed
in alternating rounds on the same sentences with the run's decoding settings (beam 4, alpha 0.6):
- "today": the former path, kept here as the peer: batches of `batch_size` sentences grouped by
  max(source, target) length, in buckets 16/32/64/128/256, the last batch padded with PAD rows, each
  batch fetched before the next is dispatched;
- "by source": `translate_encoded` with batch_size sentences a batch (sorted and bucketed by source
  length only, padding rows repeating a sentence, one batch in flight);
- "by source, N tokens": the same with a budget of N source token slots per batch.
Each contender translates once before the rounds (compiles every shape it uses; timed apart); the
figures are medians over the rounds, and the sentences that differ from "today" are counted.

With --cli_baseline=REV it also times the whole `eval.py --checkpoint=latest` command, as a user runs
it (start-up, compiles, translation, loss and scores), of revision REV (extracted with `git archive`)
and of this tree (its run's settings, then --cpu_devices=1, each --batch_tokens, each --dtypes, and
with its compilation cache filled), in alternating rounds on copies of the run, and checks that the
hypotheses files are identical.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformer_jax.data.batching import eval_batches, restore_order
from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.data.pipeline import eval_set, load_run_splits
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.evaluation.checkpoint_selection import checkpoint_params, open_run
from transformer_jax.evaluation.translate_split import _translate, fit_to_model, translate_encoded
from transformer_jax.model.config import TransformerConfig
from transformer_jax.run.config_schema import decode_options

Translator = Callable[[], list[str]]


def translate_today(params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
                    options: DecodeOptions) -> list[str]:
    """The former `translate_encoded` on one device: batches by max(source, target), fetched one by one."""
    rng = jax.random.key(options.seed)
    outputs, indices = [], []
    for batch in eval_batches(encoded, options.batch_size):
        rng, key = jax.random.split(rng)
        ids = np.asarray(_translate(params, fit_to_model(batch["inputs"], config.max_len), key, config, options))
        outputs.extend(" ".join(text.splitlines()) for text in tokenizer.decode_batch(ids))
        indices.extend(batch["index"].tolist())
    ordered = restore_order(outputs, indices, len(encoded))
    return ["" if length <= 1 else text for text, length in zip(ordered, encoded.source.lengths)]


def contenders(params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
               options: DecodeOptions, batch_tokens: list[int]) -> dict[str, Translator]:
    """Name -> a call translating `encoded` one way."""
    def ours(tokens: int) -> Translator:
        return lambda: translate_encoded(params, config, encoded, tokenizer, options.replace(batch_tokens=tokens),
                                         show_progress=False)

    result = {"today": lambda: translate_today(params, config, encoded, tokenizer, options.replace(batch_tokens=0)),
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


def run(workdir: str, sentences: int = 0, rounds: int = 3, batch_tokens: tuple[int, ...] = (256,)) -> dict[str, Any]:
    """Translate the test split of `workdir`'s run (its first `sentences`; 0: all) with every contender."""
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        raise SystemExit(f"{workdir} holds no trained run; train one first (make demo) or pass --workdir")
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
    options = decode_options(trained.config)
    print(f"{workdir} step {step}: {len(encoded)} test sentences, {options.describe()}, "
          f"batch_size {options.batch_size}; {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs", flush=True)
    result = measure(contenders(params, trained.model_config, encoded, trained.tokenizer, options, list(batch_tokens)),
                     rounds)
    for name, figures in result.items():
        print(f"{name:<28} median {figures['median_s']:7.1f} s  {len(encoded) / figures['median_s']:6.1f} sentences/s"
              f"  speed-up over today {figures['speedup_over_today']:.2f}x"
              f"  (rounds {', '.join(f'{t:.1f}' for t in figures['round_s'])} s;"
              f" first call {figures['first_call_s']:.1f} s)"
              f"  sentences differing from today: {figures['sentences_differing_from_today']}")
    return {"workdir": workdir, "step": step, "sentences": len(encoded), "rounds": rounds,
            "batch_size": options.batch_size, "contenders": result}


# (tree, eval.py flags beyond --workdir and --checkpoint; "--compilation_cache=" unless the contender uses one).
EvalContender = tuple[str, list[str]]


def eval_command(workdir: str, contender: EvalContender) -> list[str]:
    """`python eval.py` of the contender's tree on `workdir`'s test split (its last checkpoint)."""
    tree, flags = contender
    return [sys.executable, os.path.join(tree, "eval.py"), f"--workdir={workdir}", "--checkpoint=latest", *flags]


def run_eval(workdir: str, contender: EvalContender) -> tuple[float, dict[str, Any], bytes]:
    """Wall seconds of one eval.py run, its scores and its hypotheses file (the eval/ folder is cleared first)."""
    shutil.rmtree(os.path.join(workdir, "eval"), ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=contender[0], JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    seconds, _ = timed(lambda: subprocess.run(eval_command(workdir, contender), cwd=contender[0], env=env,
                                              check=True, capture_output=True))
    [scores] = [f for f in os.listdir(os.path.join(workdir, "eval")) if f.endswith(".json")]
    [hypotheses] = [f for f in os.listdir(os.path.join(workdir, "eval")) if f.endswith(".hyp")]
    with open(os.path.join(workdir, "eval", scores)) as f, open(os.path.join(workdir, "eval", hypotheses), "rb") as h:
        return seconds, json.load(f), h.read()


# Run-config keys added after the baseline revision, left out of its copy of the run (whose eval.py would
# reject them): float32_dot_outputs is False in a trained run's config, and that revision batched by sentences.
KEYS_AFTER_BASELINE = {"model": ("float32_dot_outputs",), "eval": ("batch_tokens", "dtype")}


def without_newer_keys(workdir: str) -> None:
    """Drop KEYS_AFTER_BASELINE from the run config in `workdir` (a copy for the baseline revision)."""
    path = os.path.join(workdir, "config.json")
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
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as scratch:
        old_tree = os.path.join(scratch, "before")
        os.makedirs(old_tree)
        archive = subprocess.run(["git", "-C", repo, "archive", revision], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        # Today's runs compile every program (no cache), as the old revision does; the last contender
        # loads them from a cache filled before the rounds (a later eval.py of the same shapes).
        cold = "--compilation_cache="
        contenders: dict[str, EvalContender] = {f"eval.py of {revision}": (old_tree, []),
                                                "eval.py today": (repo, [cold]),
                                                "eval.py today, one CPU device": (repo, [cold, "--cpu_devices=1"])}
        contenders.update({f"eval.py today, {t} tokens": (repo, [cold, f"--batch_tokens={t}"]) for t in batch_tokens})
        contenders.update({f"eval.py today, {dtype}": (repo, [cold, f"--dtype={dtype}"]) for dtype in dtypes})
        warm = (repo, [f"--compilation_cache={os.path.join(scratch, 'compilation_cache')}"])
        contenders["eval.py today, cache filled"] = warm
        copies = {}
        for name in contenders:
            copies[name] = os.path.join(scratch, f"run{len(copies)}")
            shutil.copytree(workdir, copies[name], ignore=shutil.ignore_patterns("eval", "run.lock"))
        without_newer_keys(copies[f"eval.py of {revision}"])
        run_eval(copies[list(contenders)[-1]], warm)  # fills the cache
        results: dict[str, Any] = {}

        def one_eval(name: str) -> float:
            seconds, *results[name] = run_eval(copies[name], contenders[name])
            return seconds

        times = alternate(list(contenders), rounds, one_eval)
    before = f"eval.py of {revision}"
    summary = {}
    for name in contenders:
        scores, hypotheses = results[name]
        summary[name] = {"round_s": times[name], "median_s": statistics.median(times[name]),
                         "speedup_over_before": statistics.median(times[before]) / statistics.median(times[name]),
                         "bleu": scores["bleu"], "same_hypotheses_as_before": hypotheses == results[before][1]}
        print(f"{name:<46} median {summary[name]['median_s']:6.1f} s  speed-up {summary[name]['speedup_over_before']:.2f}x"
              f"  BLEU {scores['bleu']:.2f}  same hypotheses as {revision}: {summary[name]['same_hypotheses_as_before']}",
              flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/demo", help="a trained run (make demo writes runs/demo)")
    parser.add_argument("--sentences", type=int, default=0, help="translate the first N test sentences (0: all)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    parser.add_argument("--batch_tokens", default="256", help="comma-separated token budgets to time (eval.py: "
                        "besides the run's own; empty: none)")
    parser.add_argument("--cli_baseline", default="", help="also time eval.py of this git revision against today's")
    parser.add_argument("--skip_library", action="store_true", help="only the eval.py comparison")
    parser.add_argument("--dtypes", default="", help="comma-separated eval.py --dtype values to time too")
    args = parser.parse_args()
    budgets = tuple(int(t) for t in args.batch_tokens.split(",") if t)
    if not args.skip_library:
        run(args.workdir, args.sentences, args.rounds, budgets)
    if args.cli_baseline:
        compare_cli(args.workdir, args.cli_baseline, args.rounds, budgets,
                    tuple(d for d in args.dtypes.split(",") if d))


if __name__ == "__main__":
    main()
