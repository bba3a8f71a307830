"""CTranslate2 as a decoding peer: the same model exported, beam 4 and greedy on CPU, float32 and int8, against ours.

The model and shapes are the decode section's: a randomly initialized Transformer (d_model 256, 3 layers,
d_ff 1024, 4 heads, vocabulary 8000), 32 source sentences of 25 tokens, every output forced to 50 tokens
(ours: no token is EOS; CTranslate2: min_decoding_length = max_decoding_length = 50), beam 4 with alpha
0.6 (the length penalty formula differs, which changes no timing). The model goes through
`export_ctranslate2`; CTranslate2 appends EOS to each source, so it is given 24 of the 25 tokens: both
encode 25 positions. Both sides use the machine's C cores (at most 8, a power of two) two ways:
CTranslate2 with intra_threads=C on one batch of 32, and with inter_threads=C on C batches in parallel;
ours (float32 and bfloat16) on one CPU device, and on C devices each searching 32/C rows (what eval.py
does on a CPU host). Runs in its own process: JAX's CPU device count is fixed when it starts.
Contenders alternate within each round; the figure is the median over rounds. Compilation is apart.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.sections.decode import (
    ALPHA,
    BEAM_SIZE,
    CONFIG,
    EXTRA_LENGTH,
    NUM_SENTENCES,
    SOURCE_LENGTH,
    beam_decoder,
    greedy_decoder,
    split_device_count,
    split_rows,
)
from benchmarks.workers import REPO, worker_command
from transformer_jax import Transformer
from transformer_jax.base import set_cpu_devices
from transformer_jax.decoding import decoding_precision
from transformer_jax.export import export_ctranslate2
from transformer_jax.model import PAD_ID

OUTPUT_LENGTH = SOURCE_LENGTH + EXTRA_LENGTH
ROUNDS = 7


def our_decoders(params: Any, src: jax.Array) -> dict[str, Callable[[], Any]]:
    """Our beam-4 and greedy searches (the decode section's, no token is EOS) in float32 and in bfloat16 (weights
    cast once), on one device and, with several CPU devices, split over them (the first call compiles)."""
    decoders = {}
    devices = len(jax.devices("cpu"))
    for prefix, dtype in (("ours", ""), ("ours bfloat16", "bfloat16")):
        weights, config = decoding_precision(params, CONFIG, dtype, "cpu")
        for name, decoder in ((f"beam {BEAM_SIZE}", beam_decoder(config)), ("greedy", greedy_decoder(config))):
            decoders[f"{prefix} {name}"] = (
                lambda decoder=decoder, w=weights: jax.block_until_ready(decoder(w, src)))
            if devices > 1:  # each device decoding its block of rows
                split, placed_weights, placed_src = split_rows(decoder, weights, src)
                decoders[f"{prefix}, {devices} devices {name}"] = (
                    lambda split=split, w=placed_weights, s=placed_src: jax.block_until_ready(split(w, s)))
    return decoders


def ct2_decoders(directory: str, src: np.ndarray, threads: int) -> dict[str, Callable[[], Any]]:
    """CTranslate2 beam 4 and greedy, float32 and int8 compute, every output OUTPUT_LENGTH tokens."""
    import ctranslate2

    pieces = [[f"t{t}" for t in row[:-1]] for row in src.tolist()]  # EOS is appended: 25 positions
    decoders = {}
    # (suffix, intra_threads, inter_threads, max_batch_size): one batch on every core, or one batch per core.
    for suffix, intra, inter, batch in (("", threads, 1, 0), (f", {threads} batches in parallel", 1, threads,
                                                              NUM_SENTENCES // threads)):
        for compute_type in ("float32", "int8"):
            translator = ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                                intra_threads=intra, inter_threads=inter)
            for name, beam in ((f"beam {BEAM_SIZE}", BEAM_SIZE), ("greedy", 1)):
                decoders[f"CTranslate2 {compute_type}{suffix} {name}"] = (
                    lambda translator=translator, beam=beam, batch=batch: translator.translate_batch(
                        pieces, beam_size=beam, length_penalty=ALPHA, min_decoding_length=OUTPUT_LENGTH,
                        max_decoding_length=OUTPUT_LENGTH, max_batch_size=batch))
    return decoders


def check_lengths(outputs: dict[str, Any]) -> None:
    """Every contender produced OUTPUT_LENGTH tokens per sentence (so all did the same work)."""
    for name, output in outputs.items():
        if name.startswith("CTranslate2"):
            lengths = {len(result.hypotheses[0]) for result in output}
        else:
            tokens = np.asarray(output[0][:, 0] if isinstance(output, tuple) else output)
            lengths = set((tokens != PAD_ID).sum(-1).tolist())
        if lengths != {OUTPUT_LENGTH}:
            raise RuntimeError(f"{name} produced output lengths {sorted(lengths)}, not {OUTPUT_LENGTH}")


def compare(rounds: int, threads: int) -> dict[str, Any]:
    """Sentences/s of every contender (median over alternating rounds) and ours / CTranslate2 ratios."""
    rng = np.random.default_rng(0)
    src = rng.integers(4, CONFIG.vocab_size, (NUM_SENTENCES, SOURCE_LENGTH)).astype(np.int32)
    params = jax.jit(Transformer(CONFIG).init)(jax.random.key(0), src[:, :2], src[:, :2])["params"]
    vocabulary = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, CONFIG.vocab_size)]
    with tempfile.TemporaryDirectory() as tmp:
        directory = export_ctranslate2(params, CONFIG, vocabulary, os.path.join(tmp, "model"))
        decoders = {**our_decoders(params, jnp.asarray(src)), **ct2_decoders(directory, src, threads)}
        start = time.perf_counter()
        check_lengths({name: decode() for name, decode in decoders.items()})  # compiles ours, warms up
        warmup_s = time.perf_counter() - start
        times: dict[str, list[float]] = {name: [] for name in decoders}
        for _ in range(rounds):
            for name, decode in decoders.items():
                start = time.perf_counter()
                decode()
                times[name].append(time.perf_counter() - start)
    speed = {name: NUM_SENTENCES / statistics.median(seconds) for name, seconds in times.items()}
    ratios = {}
    for mode in (f"beam {BEAM_SIZE}", "greedy"):
        for ours in ("ours", "ours bfloat16"):
            for compute_type in ("float32", "int8"):
                # Each side's faster way of using the cores.
                best_ours = max(v for k, v in speed.items() if k.startswith(ours) and k.endswith(mode)
                                and ("bfloat16" in k) == ("bfloat16" in ours))
                best_ct2 = max(v for k, v in speed.items() if k.startswith(f"CTranslate2 {compute_type}")
                               and k.endswith(mode))
                ratios[f"{ours} / CTranslate2 {compute_type}, {mode}, faster way each"] = best_ours / best_ct2
    return {"sentences_per_s": speed, "ratios": ratios, "rounds": rounds, "warmup_s": warmup_s,
            "shape": {"sentences": NUM_SENTENCES, "source_length": SOURCE_LENGTH, "output_length": OUTPUT_LENGTH,
                      "d_model": CONFIG.d_model, "layers": CONFIG.num_layers, "vocab_size": CONFIG.vocab_size,
                      "ctranslate2_threads": threads}}


def worker(spec: dict[str, Any]) -> None:
    """The comparison in this (fresh) process, ours on spec["threads"] CPU devices; figures to spec["json"]."""
    import ctranslate2

    set_cpu_devices(spec["threads"])  # one-device contenders use the first
    summary = compare(spec["rounds"], spec["threads"])
    print(f"{datetime.date.today()}  jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"ctranslate2 {ctranslate2.__version__}, {os.cpu_count()} CPU cores; {summary['shape']}")
    for name, value in summary["sentences_per_s"].items():
        print(f"  {name:52s} {value:8.1f} sentences/s")
    for name, value in summary["ratios"].items():
        print(f"  {name:60s} {value:6.2f}x", flush=True)
    with open(spec["json"], "w") as f:
        json.dump({"ctranslate2": ctranslate2.__version__, **summary}, f, indent=2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The comparison in a worker process (its table printed there)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "ctranslate2.json")
        spec = {"rounds": 3 if args.quick else args.rounds or ROUNDS, "threads": split_device_count(), "json": path}
        subprocess.run(worker_command("ctranslate2", spec), cwd=REPO, check=True)
        with open(path) as f:
            return json.load(f)
