"""Start-up time and peak memory of a run's data preparation on a large text corpus, first run and resume.

Writes a generated parallel text corpus (`--startup_pairs` training pairs of random pseudo-words,
WMT-like lengths), trains a SentencePiece model (vocabulary 32,000) on a small corpus's sentences once,
then times `prepare_data` (reading the text, encoding, length filter, choosing the row width, planning
the first epoch) each in a fresh process, reporting its wall time and peak resident memory (VmHWM):
  tiny corpus   1,000 pairs, same tokenizer: the floor (imports, tokenizer, dev/test);
  first run     the large corpus prepared in the workdir (data/prepared.py: encoded into token shards);
  resume        the same workdir again: the prepared corpus's index is read, the text is not encoded.

Then launch to first update: train.py with the base model's sizes (6 + 6 layers, d_model 512, float32) on the
built-in corpus (vocabulary 2,000), started as a new process and stopped with SIGTERM once timing.jsonl holds
its start-up record; the seconds from the process's start to that record (imports included), and the record's
own compile and restore seconds:
  cold cache    a new workdir, JAX's compile cache empty;
  warm cache    a new workdir, the compile cache the cold run filled;
  resume        the warm run's workdir again (it saved its state when stopped): the state is restored.
The comparison with revision c7045af's train.py is in docs/benchmarks/history.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.workers import REPO, peak_rss_bytes, worker_command
from transformer_jax.base import workdir as layout
from transformer_jax.config import default_config
from transformer_jax.data import Tokenizer, load_splits, prepare_data, train_tokenizer

MODES = ("tiny corpus", "first run", "resume")
VOCAB_SIZE = 32_000
LAUNCHES = ("cold cache", "warm cache", "resume")
BASE_SIZES = ("--config.model.num_layers=6", "--config.model.d_model=512", "--config.model.d_ff=2048",
              "--config.model.num_heads=8", "--config.model.max_len=256", "--config.data.vocab_size=2000",
              "--config.data.builtin_train_size=2000", "--config.data.tokenizer_sample_size=4000",
              "--config.data.tokens_per_batch=2048", "--config.data.max_length=64",
              "--config.training.num_train_steps=1000", "--config.training.checkpoint_every=1000")


def write_corpus(directory: str, num_pairs: int, seed: int = 0) -> None:
    """train/dev/test .en/.de files of random pseudo-words, lognormal lengths (mean about 22 words)."""
    rng = np.random.default_rng(seed)
    syllables = np.array(["ka", "te", "ri", "mo", "su", "len", "der", "ung", "sch", "ein", "the", "and", "ion", "er"])
    words = np.array(["".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(30_000)])
    os.makedirs(directory, exist_ok=True)
    for split, size in (("train", num_pairs), ("dev", 500), ("test", 500)):
        lengths = np.clip(rng.lognormal(np.log(19), 0.55, size), 1, 200).astype(int)
        for language, stretch in (("en", 1.0), ("de", 1.1)):
            ids = rng.integers(0, len(words), int((lengths * stretch).astype(int).sum() + size))
            with open(os.path.join(directory, f"{split}.{language}"), "w", encoding="utf-8") as f:
                start = 0
                for n in (np.maximum(lengths * stretch, 1)).astype(int):
                    f.write(" ".join(words[ids[start:start + n]]) + "\n")
                    start += n


def worker(spec: dict[str, Any]) -> None:
    """One measured start-up in this (fresh) process; prints a JSON line."""
    config = default_config()
    # The tokenizer in the workdir has the pieces the small corpus gave it (up to VOCAB_SIZE): the run says as many.
    pieces = Tokenizer.load(os.path.join(spec["workdir"], layout.TOKENIZER)).vocab_size
    config.data.update(source="text", path=spec["data"], vocab_size=pieces, tokens_per_batch=25_000,
                       max_length=256)
    config.model.update(num_layers=6)
    start = time.perf_counter()
    data = prepare_data(config, spec["workdir"])
    next(data.train)
    seconds = time.perf_counter() - start
    print(json.dumps({"mode": spec["mode"], "seconds": seconds, "peak_rss_bytes": peak_rss_bytes(),
                      "pairs": len(data.train.corpus), "row_width": data.train.row_width}))


def measure(mode: str, data_dir: str, workdir: str) -> dict[str, Any]:
    """Run one start-up in a new process; its figures."""
    output = subprocess.run(worker_command("startup", {"mode": mode, "data": data_dir, "workdir": workdir}),
                            cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


def train_small_tokenizer(corpus: str, path: str) -> None:
    """A SentencePiece model trained on both sides of the small corpus's training pairs, written to `path`."""
    pairs = load_splits("text", path=corpus, splits=("train",))["train"]
    train_tokenizer([text for pair in pairs for text in pair if text], path, VOCAB_SIZE)


def startup_records(workdir: str) -> list[dict[str, Any]]:
    """The start-up records of the timing log in `workdir` (one per start of train.py), complete lines only."""
    path = layout.run_path(workdir, layout.TIMING)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip().endswith("}")) if "startup_seconds" in r]


def launch(workdir: str, cache: str, timeout: float = 1200) -> dict[str, Any]:
    """Start train.py (the base model's sizes) in `workdir`, stop it once it records its start-up; the seconds
    from the process's start to that record, and the record."""
    before = len(startup_records(workdir))
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "train.py", "--config=configs/smoke.py", f"--workdir={workdir}",
                                *BASE_SIZES], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    records: list[dict[str, Any]] = []
    while len(records) <= before and process.poll() is None and time.perf_counter() - start < timeout:
        time.sleep(0.05)
        records = startup_records(workdir)
    record = records[before] if len(records) > before else None
    seconds = time.perf_counter() - start
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=600)
    if record is None:
        raise RuntimeError(f"train.py recorded no start-up (exit {process.returncode}): {errors[-2000:]}")
    return {"launch_to_first_update_s": seconds, **record}


def run_launches(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Cold cache, warm cache and resume of train.py, one line each."""
    results = []
    with tempfile.TemporaryDirectory() as root:
        cache = os.path.join(root, "cache")
        for mode in LAUNCHES:
            workdir = os.path.join(root, "warm_cache" if mode == "resume" else mode.replace(" ", "_"))
            result = {"mode": mode, **launch(workdir, cache)}
            results.append(result)
            print(f"  {mode:<11} launch to first update {result['launch_to_first_update_s']:6.1f} s  (start-up "
                  f"{result['startup_seconds']:5.1f} s: restore {result['restore_seconds']:5.1f} s, compile "
                  f"{result['compile_seconds']:5.1f} s)", flush=True)
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Data preparation (every mode), then launch to first update."""
    return {"data_preparation": run_data_preparation(args), "launch": run_launches(args)}


def run_data_preparation(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every mode, one line each."""
    pairs = 20_000 if args.quick else args.startup_pairs
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        big, tiny = os.path.join(root, "big"), os.path.join(root, "tiny")
        write_corpus(big, pairs)
        write_corpus(tiny, 1_000, seed=1)
        tokenizer_path = os.path.join(root, layout.TOKENIZER)
        train_small_tokenizer(tiny, tokenizer_path)
        print(f"wrote {pairs:,} pairs and a tokenizer in {time.perf_counter() - start:.0f} s", flush=True)
        results = []
        for mode in MODES:
            if mode != "resume":  # the resume reuses the first run's workdir
                workdir = os.path.join(root, mode.replace(" ", "_"))
                os.makedirs(workdir)
                shutil.copy(tokenizer_path, workdir)
            result = measure(mode, tiny if mode == "tiny corpus" else big, workdir)
            results.append(result)
            above = (result["peak_rss_bytes"] - results[0]["peak_rss_bytes"]) / 2**20
            print(f"{mode:<12} {result['pairs']:>9,} pairs  start-up {result['seconds']:6.1f} s  peak RSS "
                  f"{result['peak_rss_bytes'] / 2**20:7,.0f} MiB  ({above:+7,.0f} MiB over the tiny corpus)",
                  flush=True)
    return results
