"""Decoding speed: beam-4 and greedy sentences/s of this tree in float32 and bfloat16, on one CPU device and on one
per core (run side by side, alternating), and the key/value cache's speed-up over a search that reruns the whole
prefix.

Every decoder runs the public search (`beam_search`, beam 4, alpha 0.6, or `greedy_decode`) on the same randomly
initialized model (d_model 256, 3 layers, d_ff 1024, 4 heads, vocabulary 8000) and the same 32 source sentences
of 25 tokens; no token is EOS, so every output is 50 tokens long (25 + 25). Each contender lives in its own worker
process, in the precision eval.py chooses on a CPU host (`decoding_precision`), and decodes on one CPU device or
on one per core (at most 8, a power of two: the rows split over them, as eval.py's `translate_rows` does).
Rounds alternate between the contenders (one decode of the 32 sentences each); the figures are medians, with
each contender's ratio to "ours" (float32, one device) and the sentences whose tokens equal its (bfloat16 may
break near-ties the other way). The reference step (not with --quick) runs the whole prefix padded to 50 every
step. Compilation is timed apart. The comparison with the decoder before the beam-slot cache (revision bfce298)
is in docs/benchmarks/history.md.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from benchmarks import workers
from transformer_jax import Transformer, TransformerConfig
from transformer_jax.base import automatic_cpu_devices
from transformer_jax.decoding import beam_search, decoding_precision, greedy_decode

CONFIG = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=128)
NUM_SENTENCES, SOURCE_LENGTH, EXTRA_LENGTH = 32, 25, 25
BEAM_SIZE, ALPHA = 4, 0.6
NO_EOS = -1  # no token has this id, so every hypothesis runs to its maximum length
DECODERS = {"beam": f"beam {BEAM_SIZE}, key/value cache", "greedy": "greedy, key/value cache"}
ROUNDS = 7


def beam_decoder(config: TransformerConfig = CONFIG, use_cache: bool = True) -> Callable:
    """A jitted (params, src) -> ([B, 1, L] tokens, [B, 1] scores) beam search, every output L = 50 tokens."""
    def decode(params: Any, src_BxS: jax.Array) -> tuple[jax.Array, jax.Array]:
        return beam_search(params, config, src_BxS, beam_size=BEAM_SIZE, alpha=ALPHA, max_extra_length=EXTRA_LENGTH,
                           use_cache=use_cache, eos_id=NO_EOS)

    return jax.jit(decode)


def greedy_decoder(config: TransformerConfig = CONFIG) -> Callable:
    """A jitted (params, src) -> [B, L] greedy decoder with the cache, every output L = 50 tokens."""
    def decode(params: Any, src_BxS: jax.Array) -> jax.Array:
        return greedy_decode(params, config, src_BxS, max_extra_length=EXTRA_LENGTH, eos_id=NO_EOS)

    return jax.jit(decode)


def inputs() -> tuple[Any, jax.Array]:
    """The benchmark's parameters and [32, 25] source ids (the same in every process)."""
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(4, CONFIG.vocab_size, (NUM_SENTENCES, SOURCE_LENGTH)), jnp.int32)
    params = jax.jit(Transformer(CONFIG).init)(jax.random.key(0), src[:, :2], src[:, :2])["params"]
    return params, src


def measure(decoder: Callable, params: Any, src: jax.Array, repeats: int) -> dict[str, Any]:
    """Compile time, then the median wall time of `repeats` runs (and the last output)."""
    start = time.perf_counter()
    compiled = decoder.lower(params, src).compile()
    compile_s = time.perf_counter() - start
    times, output = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        output = jax.block_until_ready(compiled(params, src))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"compile_s": compile_s, "seconds": seconds, "runs": repeats,
            "sentences_per_s": NUM_SENTENCES / seconds, "output": output}


def split_rows(decoder: Callable, params: Any, src: jax.Array) -> tuple[Callable, Any, jax.Array]:
    """`decoder` with every CPU device searching its own block of rows (as eval.py's `translate_rows`),
    and the inputs placed for it: parameters whole on each device, the rows split."""
    mesh = Mesh(np.asarray(jax.devices("cpu")), ("rows",))
    rows = PartitionSpec("rows")
    split = jax.jit(jax.shard_map(decoder, mesh=mesh, in_specs=(PartitionSpec(), rows), out_specs=rows,
                                  check_vma=False))
    return (split, jax.device_put(params, NamedSharding(mesh, PartitionSpec())),
            jax.device_put(src, NamedSharding(mesh, rows)))


def worker(spec: dict[str, Any]) -> None:
    """A worker decoding on spec["devices"] CPU devices in the precision eval.py chooses for spec["dtype"]."""
    if spec["devices"] > 1:
        jax.config.update("jax_num_cpu_devices", spec["devices"])
    params, src = inputs()
    params, config = decoding_precision(params, CONFIG, spec["dtype"], "cpu")
    kind = spec["kind"]
    decoder = beam_decoder(config) if kind == "beam" else greedy_decoder(config)
    if spec["devices"] > 1:
        decoder, params, src = split_rows(decoder, params, src)
    outputs: list[Any] = []

    def build() -> Callable[[], Any]:
        compiled = decoder.lower(params, src).compile()

        def step() -> None:
            outputs[:] = [jax.block_until_ready(compiled(params, src))]

        return step

    def describe() -> dict[str, Any]:
        tokens = np.asarray(outputs[0][0] if kind == "beam" else outputs[0]).reshape(NUM_SENTENCES, -1)
        return {"tokens_sha256": [hashlib.sha256(row.tobytes()).hexdigest() for row in tokens]}

    workers.serve(build, lambda: {"peak_rss_bytes": workers.peak_rss_bytes()}, describe)


def compare(kind: str, contenders: dict[str, tuple[str, int]], rounds: int) -> dict[str, Any]:
    """Alternating rounds of one decode per contender (name -> (dtype, CPU devices)), each in its own worker; the
    first contender is the one the others' ratios and tokens are read against."""
    started = {name: workers.Worker(workers.worker_command("decode", {"kind": kind, "dtype": dtype,
                                                                      "devices": devices}))
               for name, (dtype, devices) in contenders.items()}
    try:
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, started_worker in started.items():
                times[name].append(started_worker.seconds_per_step(1))
        digests = {name: started_worker.describe()["tokens_sha256"] for name, started_worker in started.items()}
    finally:
        for started_worker in started.values():
            started_worker.close()
    first = next(iter(contenders))
    result: dict[str, Any] = {}
    for name in contenders:
        seconds = statistics.median(times[name])
        result[name] = {"seconds": seconds, "sentences_per_s": NUM_SENTENCES / seconds,
                        "compile_s": started[name].ready["compile_s"], "round_seconds": times[name],
                        "speedup": statistics.median(times[first]) / seconds,
                        "sentences_as_first": sum(a == b for a, b in zip(digests[first], digests[name]))}
    return result


def compare_all(rounds: int, dtypes: tuple[str, ...], devices: tuple[int, ...], with_reference: bool,
                repeats: int = 3) -> dict[str, Any]:
    """Beam-4 and greedy sentences/s in each of `dtypes` ('' = the model's float32) on each count of CPU `devices`;
    with the reference, the key/value cache's speed-up over the full-prefix search."""
    summary: dict[str, Any] = {"rounds": rounds}
    contenders = {contender_name(dtype, count): (dtype, count) for count in devices for dtype in dtypes}
    summary["decoders"] = {kind: compare(kind, contenders, rounds) for kind in DECODERS}
    if with_reference:
        params, src = inputs()
        cached = measure(beam_decoder(), params, src, repeats)
        reference = measure(beam_decoder(use_cache=False), params, src, 1)
        summary["reference"] = {k: v for k, v in reference.items() if k != "output"}
        summary["cache_speedup"] = reference["seconds"] / cached["seconds"]
        summary["same_beams_as_reference"] = bool(np.array_equal(cached["output"][0], reference["output"][0]))
    summary["shape"] = {"sentences": NUM_SENTENCES, "source_length": SOURCE_LENGTH,
                        "output_length": SOURCE_LENGTH + EXTRA_LENGTH, "d_model": CONFIG.d_model,
                        "layers": CONFIG.num_layers, "vocab_size": CONFIG.vocab_size}
    return summary


def split_device_count() -> int:
    """CPU devices for the split contenders: one per usable core, at most 8, rounded down to a power of
    two (so that they divide the NUM_SENTENCES rows)."""
    return 1 << (automatic_cpu_devices().bit_length() - 1)


def contender_name(dtype: str, devices: int = 1) -> str:
    """'ours' for the model's own dtype on one device, else e.g. 'ours bfloat16, 2 devices'."""
    return "ours" + (f" {dtype}" if dtype else "") + (f", {devices} devices" if devices > 1 else "")


def print_summary(result: dict[str, Any]) -> None:
    """The decode section's table: sentences/s per contender, its ratio to the first, the sentences alike."""
    for kind, row in result["decoders"].items():
        first = next(iter(row))
        for name, ours in row.items():
            line = (f"{DECODERS[kind]:<32} {name:<24} {ours['sentences_per_s']:7.1f} sentences/s "
                    f"({ours['seconds']:.2f} s, compile {ours['compile_s']:.1f} s)")
            if name != first:
                line += (f" | /{first} {ours['speedup']:.2f}x | sentences with {first}'s tokens: "
                         f"{ours['sentences_as_first']}/{NUM_SENTENCES}")
            print(line, flush=True)
    if "cache_speedup" in result:
        reference = result["reference"]
        print(f"{'beam 4, full forward on the prefix':<32} {reference['sentences_per_s']:7.1f} sentences/s; "
              f"key/value cache speed-up {result['cache_speedup']:.1f}x; same beams: "
              f"{result['same_beams_as_reference']}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Ours in float32 and bfloat16 on one device and one per core; the cache's speed-up."""
    split = split_device_count()
    result = compare_all(rounds=3 if args.quick else args.rounds or ROUNDS, dtypes=("", "bfloat16"),
                         devices=(1, split) if split > 1 else (1,), with_reference=not args.quick,
                         repeats=2 if args.quick else 3)
    print_summary(result)
    return result
