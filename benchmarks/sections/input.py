"""Input at scale: one process's batches against the update time, its memory and start-up on millions of
prepared pairs, and preparing throughput from text.

Every process of a run reads the prepared corpus's length index, plans the epoch from lengths and reads
only the pairs of its own rows (data/prepared.py, data/batching.py). Measured on synthetic WMT-like
prepared corpora (random ids, WMT-like lengths; benchmarks/corpora.py), the rows chosen for the paper's
base model (vocabulary 37,000, max_length 256) as a run chooses them:

  batch building  a fresh process, every thread pinned to one CPU core (os.sched_setaffinity), builds its
                  batches: median and p90 ms per batch over `--input_batches` after the first, against the
                  preflight's roofline time of one update (BENCHMARKS.md, the aot table): the paper's base
                  batch fed by one process to 8 x H100 (5.9 ms), and one v5e-256 host's 1/64 of a
                  65,536-token batch (11.0 ms). Then the same batches through the training loop's Prefetcher
                  (depth data.prefetch_batches, placed with jax.device_put on a CPU device, waited for), back
                  to back and behind a simulated step (sleeping the roofline time while the devices would run
                  it): the consumer's wait per batch. And the length of an epoch against the time
                  planning an epoch alone; the consumer's waits behind steps while the next epoch is planned
                  in the background (BatchIterator's thread) and across the epoch boundary.
  memory and      a fresh process per corpus size (`--input_pairs`): resident memory after its imports and
  start-up        its peak (VmHWM: ru_maxrss without what a forked child inherits) over opening the corpus,
                  the length filter, choosing the rows, planning the epoch and 50 batches of the 8 x H100
                  feed, and the peak of each phase (VmHWM reset between them through /proc/self/clear_refs);
                  the start-up to the first batch split into those phases.
  preparing       pairs/s of preparing a text corpus (`--input_text_pairs` pairs of random words from a
                  vocabulary of 20,000 at Zipf frequencies, WMT-like lengths) with 1 and 2 worker processes,
                  in shards of a quarter of the pairs: reading the text, encoding, writing the shards and
                  the index (write_prepared); the tokenizer (vocabulary 8,000, trained on 20,000 of the
                  sentences) is trained once beforehand and not timed.

The shards are read from the page cache (just written); a first epoch on a cold disk reads them from disk.

    python -m benchmarks.run --sections input [--input_pairs 1000000,4500000,10000000]   # 2-4 min, 2 GB of /tmp
    python -m benchmarks.run --sections input --quick   # 100,000 pairs, 20,000 text pairs, 50 batches: 15 s
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from benchmarks.corpora import write_wmt_like_prepared, write_wmt_like_text
from benchmarks.workers import REPO, cpu_model, peak_rss_bytes, worker_command
from transformer_jax import TransformerConfig
from transformer_jax.base import workdir as layout
from transformer_jax.config import default_config
from transformer_jax.data import (
    BatchIterator,
    PreparedCorpus,
    choose_packed_rows,
    filter_by_length,
    load_splits,
    train_tokenizer,
    width_multiple,
    write_prepared,
)
from transformer_jax.run import Prefetcher

MAX_LENGTH = 256
MODEL = TransformerConfig(vocab_size=37_000)  # the paper's base model: what the row width is chosen for
TEXT_VOCAB = 8_000
MEMORY_BATCHES = 50
FULL_PAIRS = "1000000,4500000,10000000"
# The targets.
SPEED_TARGET = 3.0  # roofline / build time per batch
PEAK_RSS_TARGET = 1.5e9  # bytes
STARTUP_PAIRS, STARTUP_TARGET_S = 4_500_000, 60.0


@dataclasses.dataclass(frozen=True)
class Feed:
    """One process's share of a global batch, and the preflight's roofline time of the update it feeds."""

    name: str
    tokens_per_batch: int
    row_multiple: int  # devices the global batch is split over
    process_count: int
    roofline_s: float
    roofline_source: str
    platform: str  # the chips' platform: packed widths are multiples of its tile (shapes.width_multiple)


FEEDS = (
    Feed("8 x H100, one process", 25_000, 8, 1, 5.9e-3, "base on h100-8, results/aot-table-gpu-2026-11-23.jsonl",
         "gpu"),
    Feed("v5e-256, host 0 of 64", 65_536, 256, 64, 11.0e-3, "base on v5e:16x16, results/aot-table-2026-11-23.jsonl",
         "tpu"),
)


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def peak_since_reset() -> int:
    """This process's peak resident memory (VmHWM) since the last call, then reset to what it holds now
    (Linux's clear_refs): the peak of each phase."""
    peak = peak_rss_bytes()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak


def pin_to_one_core() -> int:
    """Pin every thread of this process (JAX's and BLAS's included) to the last core it may use; returns it."""
    core = max(os.sched_getaffinity(0))
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {core})
    return core


def start_feed(directory: str, feed: Feed,
               peaks: dict[str, int] | None = None) -> tuple[BatchIterator, dict[str, float], int]:
    """Open a prepared corpus and plan `feed`'s batches as a run's process does; the iterator, the seconds of
    each phase and the pairs the length filter dropped. With `peaks`, each phase's peak memory goes there."""
    phases, start = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        phases[name] = time.perf_counter() - start
        if peaks is not None:
            peaks[name] = peak_since_reset()
        start = time.perf_counter()

    corpus = PreparedCorpus.open(directory)
    lap("open")
    train, dropped = filter_by_length(corpus, MAX_LENGTH)
    lap("filter")
    multiple = width_multiple(feed.platform)
    layout = choose_packed_rows(train, MODEL, feed.tokens_per_batch, MAX_LENGTH, feed.row_multiple, multiple=multiple)
    lap("rows")
    iterator = BatchIterator(train, feed.tokens_per_batch, MAX_LENGTH, row_width=layout.width,
                             rows_per_width=layout.rows, row_multiple=feed.row_multiple,
                             process_count=feed.process_count, width_multiple=multiple)
    iterator.plan(0)
    lap("plan")
    return iterator, phases, dropped


def memory_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Start-up phases and resident memory of one process opening a corpus and building 50 batches."""
    imports_s, baseline = time.time() - spec["launched"], resident_bytes()
    peaks = {"python and imports": peak_since_reset()}
    iterator, phases, dropped = start_feed(spec["corpus"], FEEDS[0], peaks)
    start = time.perf_counter()
    next(iterator)
    phases = {"python and imports": imports_s, **phases, "first batch": time.perf_counter() - start}
    for _ in range(MEMORY_BATCHES - 1):
        next(iterator)
    peaks[f"{MEMORY_BATCHES} batches"] = peak_since_reset()
    return {"pairs": len(iterator.corpus) + dropped, "dropped": dropped, "startup_s": sum(phases.values()),
            "phases_s": phases, "rss_after_imports_bytes": baseline, "peak_rss_bytes": max(peaks.values()),
            "phase_peak_rss_bytes": peaks, "batches": MEMORY_BATCHES, "pairs_read": iterator.corpus.records_read}


def waits(take: Callable[[], Any], count: int, step_s: float = 0.0) -> np.ndarray:
    """Seconds each of `count` calls of `take` (after a first, untimed) kept the caller waiting, sleeping
    `step_s` after each (a step the devices run while the host is free)."""
    take()
    time.sleep(step_s)
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        take()
        seconds.append(time.perf_counter() - start)
        time.sleep(step_s)
    return np.asarray(seconds)


def feed_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One feed's batch building on one core: directly, then through the Prefetcher back to back and behind steps."""
    core = pin_to_one_core()
    feed, count = FEEDS[spec["feed"]], spec["batches"]
    iterator, phases, _ = start_feed(spec["corpus"], feed)
    sample = [next(iterator) for _ in range(5)]
    if iterator._planning is not None:  # time the building alone: the next epoch's planning is measured below
        iterator._planning[1].join()
    real_tokens = np.mean([np.count_nonzero(b["inputs"]) + np.count_nonzero(b["targets"]) for b in sample])
    read_before, read_s, read = iterator.corpus.records_read, [], iterator.corpus.read

    def timed_read(items: np.ndarray) -> Any:  # the batch's share spent reading its pairs from the shards
        start = time.perf_counter()
        pairs = read(items)
        read_s.append(time.perf_counter() - start)
        return pairs

    iterator.corpus.read = timed_read
    build = waits(lambda: next(iterator), count)
    read_s = read_s[-count:]
    pairs_per_batch = (iterator.corpus.records_read - read_before) / (count + 1)
    device = jax.devices("cpu")[0]
    depth = default_config().data.prefetch_batches
    result = {"core": core, "shapes": iterator.shapes(), "real_tokens_per_batch": float(real_tokens),
              "pairs_per_batch": pairs_per_batch, "build_s": build.tolist(), "read_s": read_s, "depth": depth,
              "plan_s": phases["plan"], "batches_per_epoch": len(iterator.plan(0))}
    place = lambda batch: jax.block_until_ready(jax.device_put(batch, device))  # noqa: E731
    for name, step_s in (("prefetch_back_to_back_s", 0.0), ("prefetch_behind_step_s", feed.roofline_s)):
        prefetcher = Prefetcher(iterator, place, depth)
        result[name] = waits(lambda: next(prefetcher), count, step_s).tolist()
        prefetcher.close()
    result.update(epoch_boundary(iterator, place, depth, feed.roofline_s))
    return result


def epoch_boundary(iterator: BatchIterator, place: Callable[[Any], Any], depth: int, step_s: float) -> dict[str, Any]:
    """The consumer's waits behind steps while the next epoch is planned in the background (the iterator's
    thread, started by an epoch's first batch), and across the epoch boundary once it is planned."""
    iterator._plans = {0: iterator.plan(0)}  # forget epoch 1's plan: the first batch below plans it again
    iterator._planning = None
    iterator.set_state({**iterator.get_state(), "position": 0})
    prefetcher = Prefetcher(iterator, place, depth)  # its first batch starts planning epoch 1
    during, start = [], time.perf_counter()
    while not during or (iterator._planning is not None and iterator._planning[1].is_alive()):
        began = time.perf_counter()
        next(prefetcher)
        during.append(time.perf_counter() - began)
        time.sleep(step_s)
    planned_in = time.perf_counter() - start
    prefetcher.close()
    iterator.set_state({**iterator.get_state(), "position": len(iterator.plan(0)) - 5})
    prefetcher = Prefetcher(iterator, place, depth)
    across = waits(lambda: next(prefetcher), 10, step_s)  # 5 batches before the boundary, 5 after
    prefetcher.close()
    return {"planned_in_background_s": planned_in, "waits_while_planning_s": during, "waits_across_boundary_s":
            across.tolist(), "crossed_to_epoch": iterator.epoch}


def worker(spec: dict[str, Any]) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    result = memory_worker(spec) if spec["task"] == "memory" else feed_worker(spec)
    print(json.dumps(result))


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one worker in a new process (JAX on the CPU: input is host work); its figures."""
    spec = {**spec, "launched": time.time()}
    done = subprocess.run(worker_command("input", spec), cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode:
        raise RuntimeError(f"input worker {spec['task']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_preparing(text: str, tokenizer_path: str, output: str, workers: int) -> dict[str, Any]:
    """Prepare the text corpus at `text` into `output` with `workers` processes (the tokenizer given): seconds
    reading the text and encoding plus writing, pairs/s."""
    start = time.perf_counter()
    splits = load_splits("text", path=text)
    read_s = time.perf_counter() - start
    pairs = len(splits["train"])
    write_prepared(output, {"benchmark": "input"}, tokenizer_path, splits["train"],
                   {"dev": splits["dev"], "test": splits["test"]}, workers, shard_pairs=math.ceil(pairs / 4))
    total_s = time.perf_counter() - start
    return {"workers": workers, "pairs": pairs, "shards": 4, "read_s": read_s, "encode_write_s": total_s - read_s,
            "total_s": total_s, "pairs_per_s": pairs / total_s}


def report_preparing(root: str, pairs: int) -> list[dict[str, Any]]:
    """Write the text corpus, train its tokenizer once, time preparing it with 1 and 2 workers; one line each."""
    start = time.perf_counter()
    text = os.path.join(root, "text")
    write_wmt_like_text(text, pairs)
    train = load_splits("text", path=text, splits=("train",))["train"]
    sentences = [side for pair in train[:10_000] for side in pair]
    tokenizer = train_tokenizer(sentences, os.path.join(root, layout.TOKENIZER), TEXT_VOCAB)
    print(f"wrote {pairs:,} text pairs and trained a tokenizer of {tokenizer.vocab_size:,} pieces on 20,000 of their "
          f"sentences in {time.perf_counter() - start:.0f} s (not timed below)", flush=True)
    results = []
    for workers in (1, 2):
        output = os.path.join(root, f"prepared-{workers}")
        result = time_preparing(text, os.path.join(root, layout.TOKENIZER), output, workers)
        shutil.rmtree(output)
        results.append(result)
        print(f"preparing  {workers} worker(s)  {pairs:,} pairs in 4 shards  {result['total_s']:6.1f} s = read text "
              f"{result['read_s']:.1f} s + encode and write {result['encode_write_s']:.1f} s  "
              f"{result['pairs_per_s']:9,.0f} pairs/s", flush=True)
    return results


def report_memory(size: int, result: dict[str, Any]) -> None:
    """One corpus size's start-up and memory line."""
    phases = " + ".join(f"{name} {seconds:.1f}" for name, seconds in result["phases_s"].items())
    print(f"{size:>11,} pairs ({result['dropped']} dropped)  RSS after imports "
          f"{result['rss_after_imports_bytes'] / 1e9:.2f} GB  peak {result['peak_rss_bytes'] / 1e9:.2f} GB  "
          f"start-up {result['startup_s']:5.1f} s = {phases} s", flush=True)
    peaks = ", ".join(f"{name} {peak / 1e9:.2f}" for name, peak in result["phase_peak_rss_bytes"].items())
    print(f"{'':13}peak RSS by phase: {peaks} GB", flush=True)


def ms(seconds: list[float], quantile: float) -> float:
    """A quantile of durations in seconds, in milliseconds."""
    return 1e3 * float(np.quantile(seconds, quantile))


def report_feed(feed: Feed, result: dict[str, Any]) -> None:
    """One feed's lines: building on one core against the roofline, then through the Prefetcher."""
    median, p90, roofline = ms(result["build_s"], 0.5), ms(result["build_s"], 0.9), 1e3 * feed.roofline_s
    shapes = ", ".join(f"{rows}x{width}" for rows, width in result["shapes"])
    print(f"{feed.name:<24} this process's rows {shapes}, {result['real_tokens_per_batch']:,.0f} real tokens (inputs + "
          f"targets) and {result['pairs_per_batch']:,.0f} pairs a batch", flush=True)
    print(f"  building, core {result['core']}: median {median:.2f} ms, p90 {p90:.2f} ms a batch "
          f"({len(result['build_s'])} batches; reading the pairs median {ms(result['read_s'], 0.5):.2f} ms), "
          f"{result['real_tokens_per_batch'] / median / 1e3:.1f} M real tokens/s; roofline {roofline:.1f} ms / median "
          f"= {roofline / median:.1f}x (p90 {roofline / p90:.1f}x)", flush=True)
    back, behind = result["prefetch_back_to_back_s"], result["prefetch_behind_step_s"]
    print(f"  Prefetcher (depth {result['depth']}, device_put to CPU): back to back {ms(back, 0.5):.2f} ms a batch "
          f"(p90 {ms(back, 0.9):.2f}); behind a {roofline:.1f} ms step the consumer waits median "
          f"{ms(behind, 0.5):.3f} ms, p90 {ms(behind, 0.9):.3f} ms, max {1e3 * max(behind):.2f} ms", flush=True)
    epoch = result["batches_per_epoch"]
    during, across = result["waits_while_planning_s"], result["waits_across_boundary_s"]
    print(f"  an epoch: {epoch:,} batches ({epoch * feed.roofline_s:.0f} s of updates at the roofline); planning one "
          f"takes {result['plan_s']:.1f} s alone, and the next epoch's plan was made in the background in "
          f"{result['planned_in_background_s']:.1f} s behind {len(during)} steps, the consumer waiting median "
          f"{ms(during, 0.5):.3f} ms, p90 {ms(during, 0.9):.3f} ms, max {1e3 * max(during):.1f} ms meanwhile; across "
          f"the boundary (10 batches) max {1e3 * max(across):.2f} ms", flush=True)


def verdicts(memory: dict[int, dict[str, Any]], feeds: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """The issue's targets, PASS or FAIL each, printed and returned."""
    results = {}
    for feed in FEEDS:
        if feed.name in feeds:
            ratio = feed.roofline_s / float(np.median(feeds[feed.name]["build_s"]))
            results[f"{feed.name}: roofline / build >= {SPEED_TARGET:.0f}x"] = ratio >= SPEED_TARGET
    peak = max(result["peak_rss_bytes"] for result in memory.values())
    results[f"peak RSS <= {PEAK_RSS_TARGET / 1e9:.1f} GB at every size (largest {peak / 1e9:.2f} GB)"] = (
        peak <= PEAK_RSS_TARGET)
    size = min(memory, key=lambda n: abs(n - STARTUP_PAIRS))
    startup = memory[size]["startup_s"]
    results[f"start-up <= {STARTUP_TARGET_S:.0f} s at {size:,} pairs ({startup:.1f} s)"] = startup <= STARTUP_TARGET_S
    if len(memory) > 1:
        (small, low), (large, high) = min(memory.items()), max(memory.items())
        growth = (high["peak_rss_bytes"] - low["peak_rss_bytes"]) / (large - small)
        print(f"peak RSS grows {growth:.0f} bytes a pair (MB a million pairs) from {small:,} to {large:,} pairs")
    for name, ok in results.items():
        print(f"target {name}: {'PASS' if ok else 'FAIL'}")
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Preparing, then per corpus size memory and start-up (and the feeds at the size nearest 4.5M pairs)."""
    sizes = sorted(int(n) for n in (args.input_pairs or ("100000" if args.quick else FULL_PAIRS)).split(","))
    text_pairs = args.input_text_pairs or (20_000 if args.quick else 200_000)
    batches = args.input_batches or (50 if args.quick else 200)
    feed_size = min(sizes, key=lambda n: abs(n - STARTUP_PAIRS))
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores; GB = 10^9 bytes; shards read from the page cache")
    memory, feeds = {}, {}
    with tempfile.TemporaryDirectory() as root:
        preparing = report_preparing(root, text_pairs)
        print(f"memory and start-up: a fresh process per corpus opening it, filtering, choosing the rows, planning "
              f"an epoch and building {MEMORY_BATCHES} batches ({FEEDS[0].name})", flush=True)
        for size in sizes:
            corpus, start = os.path.join(root, f"corpus-{size}"), time.perf_counter()
            write_wmt_like_prepared(corpus, size, os.path.join(root, layout.TOKENIZER))
            print(f"made a prepared corpus of {size:,} WMT-like pairs in {time.perf_counter() - start:.0f} s",
                  flush=True)
            memory[size] = measure({"task": "memory", "corpus": corpus})
            report_memory(size, memory[size])
            if size == feed_size:
                print(f"batch building on the {size:,}-pair corpus: a fresh process per feed, every thread pinned "
                      f"to one core (os.sched_setaffinity)", flush=True)
                for index, feed in enumerate(FEEDS):
                    feeds[feed.name] = measure({"task": "feed", "corpus": corpus, "feed": index, "batches": batches})
                    report_feed(feed, feeds[feed.name])
            shutil.rmtree(corpus)
    return {"preparing": preparing, "memory": memory, "feeds": feeds, "targets": verdicts(memory, feeds),
            "rooflines": {feed.name: [feed.roofline_s, feed.roofline_source] for feed in FEEDS}}
