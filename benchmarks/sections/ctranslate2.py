"""CTranslate2 as a decoding peer: the same model exported, beam 4 and greedy on CPU, float32 and int8, against ours.

  python benchmarks/ctranslate2_peer.py [--rounds=5] [--cpu_devices=2] [--json=PATH]

The model and shapes are decode_speed.py's: a randomly initialized Transformer (d_model 256, 3 layers,
d_ff 1024, 4 heads, vocabulary 8000), 32 source sentences of 25 tokens, every output forced to 50
tokens (ours: no token is EOS; CTranslate2: min_decoding_length = max_decoding_length = 50), beam 4
with alpha 0.6 (the length penalty formula differs, which changes no timing). The model goes through
`export_ctranslate2`; CTranslate2 appends EOS to each source, so it is given 24 of the 25 tokens: both
encode 25 positions. Both sides use the 2 cores two ways: CTranslate2 with intra_threads=2 on one batch
of 32, and with inter_threads=2 on two batches of 16 in parallel; ours on one CPU device, and on two
devices each searching 16 rows (what eval.py does on a CPU host: `--cpu_devices`). On another machine
"2" is its core count (at most 8, a power of two).
Contenders alternate within each round; the figure is the median over rounds. Compilation is apart.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode_speed import (  # noqa: E402
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

from transformer_jax import Transformer  # noqa: E402
from transformer_jax.decoding.cache import cached_step  # noqa: E402
from transformer_jax.decoding.translate import in_dtype  # noqa: E402
from transformer_jax.export import export_ctranslate2  # noqa: E402

OUTPUT_LENGTH = SOURCE_LENGTH + EXTRA_LENGTH
THREADS = split_device_count()  # this machine's cores (at most 8, a power of two)


def our_decoders(params: Any, src: jax.Array) -> dict[str, Callable[[], Any]]:
    """Our beam-4 and greedy searches (decode_speed.py's, no token is EOS) in float32 and in bfloat16 (weights
    cast once), on one device and, with several CPU devices, split over them (the first call compiles)."""
    decoders = {}
    devices = len(jax.devices("cpu"))
    for prefix, dtype in (("ours", ""), ("ours bfloat16", "bfloat16")):
        weights, config = in_dtype(params, CONFIG, dtype)
        for name, decoder in ((f"beam {BEAM_SIZE}", beam_decoder(cached_step, config)),
                              ("greedy", greedy_decoder(config))):
            decoders[f"{prefix} {name}"] = (
                lambda decoder=decoder, w=weights: jax.block_until_ready(decoder(w, src)))
            if devices > 1:  # each device decoding its block of rows
                split, placed_weights, placed_src = split_rows(decoder, weights, src)
                decoders[f"{prefix}, {devices} devices {name}"] = (
                    lambda split=split, w=placed_weights, s=placed_src: jax.block_until_ready(split(w, s)))
    return decoders


def ct2_decoders(directory: str, src: np.ndarray) -> dict[str, Callable[[], Any]]:
    """CTranslate2 beam 4 and greedy, float32 and int8 compute, every output OUTPUT_LENGTH tokens."""
    import ctranslate2

    pieces = [[f"t{t}" for t in row[:-1]] for row in src.tolist()]  # EOS is appended: 25 positions
    decoders = {}
    # (suffix, intra_threads, inter_threads, max_batch_size): one batch on both cores, or two in parallel.
    for suffix, intra, inter, batch in (("", THREADS, 1, 0), (f", {THREADS} batches in parallel", 1, THREADS,
                                                              NUM_SENTENCES // THREADS)):
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
            lengths = set((tokens != 0).sum(-1).tolist())
        if lengths != {OUTPUT_LENGTH}:
            raise RuntimeError(f"{name} produced output lengths {sorted(lengths)}, not {OUTPUT_LENGTH}")


def run(rounds: int = 5) -> dict[str, Any]:
    """Sentences/s of every contender (median over alternating rounds) and ours / CTranslate2 ratios."""
    rng = np.random.default_rng(0)
    src = rng.integers(4, CONFIG.vocab_size, (NUM_SENTENCES, SOURCE_LENGTH)).astype(np.int32)
    params = jax.jit(Transformer(CONFIG).init)(jax.random.key(0), src[:, :2], src[:, :2])["params"]
    vocabulary = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, CONFIG.vocab_size)]
    with tempfile.TemporaryDirectory() as tmp:
        directory = export_ctranslate2(params, CONFIG, vocabulary, os.path.join(tmp, "model"))
        decoders = {**our_decoders(params, jnp.asarray(src)), **ct2_decoders(directory, src)}
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
                      "ctranslate2_threads": THREADS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu_devices", type=int, default=THREADS, help="ours also on this many CPU devices (1: not)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    import ctranslate2

    from transformer_jax.run.sharding import set_cpu_devices

    set_cpu_devices(args.cpu_devices)  # one-device contenders use the first

    summary = run(args.rounds)
    print(f"{datetime.date.today()}  jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"ctranslate2 {ctranslate2.__version__}, {os.cpu_count()} CPU cores; {summary['shape']}")
    for name, value in summary["sentences_per_s"].items():
        print(f"  {name:52s} {value:8.1f} sentences/s")
    for name, value in summary["ratios"].items():
        print(f"  {name:60s} {value:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ctranslate2": ctranslate2.__version__, **summary}, f, indent=2)


if __name__ == "__main__":
    main()
