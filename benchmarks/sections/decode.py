"""Decoding speed: beam-4 and greedy sentences/s of this tree against an earlier revision's decoding
(run side by side, alternating), and the key/value cache's speed-up over a beam search that reruns
the whole prefix every step (a section of benchmarks/run.py; alone: python benchmarks/decode_speed.py).

All decoders run the same search (`beam_search_loop`, beam 4, alpha 0.6, or `token_loop` greedy) on
the same randomly initialized model (d_model 256, 3 layers, d_ff 1024, 4 heads, vocabulary 8000) and
the same 32 source sentences of 25 tokens; EOS is disabled so that every output is 50 tokens long
(25 + 25). "before" is the decoding code of BASELINE_REVISION (before the beam-slot cache), extracted
with `git archive` and imported in its own worker process; "ours" is this tree, also in a worker.
Rounds alternate between the contenders (one decode of the 32 sentences each); the figures are
medians. `--dtypes=float32,bfloat16` adds "ours" decoding in each dtype (DecodeOptions.dtype: weights
cast once, matmuls in that dtype); "before" always decodes in float32, as that revision could only.
Tokens are compared per sentence against "before" (bfloat16 may break near-ties the other way).
The reference step runs `Transformer.__call__` on the whole prefix padded to 50 every step; it takes
about a minute on 2 CPU cores. Compilation is timed apart.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__" and os.environ.get("DECODE_SPEED_TREE"):
    sys.path.insert(0, os.environ["DECODE_SPEED_TREE"])  # a worker of an earlier revision

import workers  # noqa: E402

from transformer_jax import Transformer, TransformerConfig  # noqa: E402
from transformer_jax.decoding.beam_search import beam_search_loop  # noqa: E402
from transformer_jax.decoding.cache import cached_step, prefix_step  # noqa: E402
from transformer_jax.decoding.lengths import max_output_lengths  # noqa: E402
from transformer_jax.decoding.sampling import greedy_choice, token_loop  # noqa: E402

CONFIG = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=128)
NUM_SENTENCES, SOURCE_LENGTH, EXTRA_LENGTH = 32, 25, 25
BEAM_SIZE, ALPHA = 4, 0.6
NO_EOS = -1  # no token has this id, so every hypothesis runs to its maximum length
# The last revision whose beam search reordered every layer's whole self-attention cache each step.
BASELINE_REVISION = "bfce298"
DECODERS = {"beam": f"beam {BEAM_SIZE}, key/value cache", "greedy": "greedy, key/value cache"}


def beam_decoder(make_step: Callable, config: TransformerConfig = CONFIG) -> Callable:
    """A jitted (params, src) -> ([B, 1, L] tokens, [B, 1] scores) beam search over `make_step`."""
    output_length = SOURCE_LENGTH + EXTRA_LENGTH

    def decode(params: Any, src_BxS: jax.Array) -> tuple[jax.Array, jax.Array]:
        step_fn, state = make_step(params, config, src_BxS, BEAM_SIZE, output_length)
        max_lengths_B = max_output_lengths(src_BxS, EXTRA_LENGTH, config.max_len)
        out = beam_search_loop(step_fn, state, max_lengths_B, beam_size=BEAM_SIZE,
                               output_length=output_length, alpha=ALPHA, eos_id=NO_EOS)
        return out.tokens_BxnxL, out.scores_Bxn

    return jax.jit(decode)


def greedy_decoder(config: TransformerConfig = CONFIG) -> Callable:
    """A jitted (params, src) -> [B, L] greedy decoder with the cache."""
    output_length = SOURCE_LENGTH + EXTRA_LENGTH

    def decode(params: Any, src_BxS: jax.Array) -> jax.Array:
        step_fn, state = cached_step(params, config, src_BxS, 1, output_length)
        max_lengths_B = max_output_lengths(src_BxS, EXTRA_LENGTH, config.max_len)
        return token_loop(step_fn, state, max_lengths_B, output_length, greedy_choice,
                          jax.random.key(0), eos_id=NO_EOS)[0]

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


def worker_main(kind: str, dtype: str, devices: int) -> None:
    """A worker process decoding with whichever transformer_jax it imports (see `compare`), on `devices`
    CPU devices (only this tree's workers are given a dtype)."""
    if devices > 1:  # (through jax.config: an earlier revision has no set_cpu_devices)
        jax.config.update("jax_num_cpu_devices", devices)
    params, src = inputs()
    config = CONFIG
    if dtype:
        from transformer_jax.decoding.translate import in_dtype

        params, config = in_dtype(params, config, dtype)
    decoder = beam_decoder(cached_step, config) if kind == "beam" else greedy_decoder(config)
    if devices > 1:
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


def baseline_tree(revision: str, directory: str) -> str | None:
    """`transformer_jax` of `revision` extracted under `directory`; None when git cannot give it."""
    archive = subprocess.run(["git", "-C", REPO, "archive", revision, "transformer_jax"], capture_output=True)
    if archive.returncode != 0:
        print(f"no baseline: git archive {revision} failed ({archive.stderr.decode().strip()})")
        return None
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    return directory


def compare(kind: str, trees: dict[str, tuple[str, str, int]], rounds: int) -> dict[str, Any]:
    """Alternating rounds of one decode per contender (name -> (tree, dtype, CPU devices)), each in its own
    worker."""
    started = {}
    for name, (tree, dtype, devices) in trees.items():
        env = dict(os.environ, DECODE_SPEED_TREE=tree, PYTHONPATH=tree)
        command = [sys.executable, os.path.abspath(__file__), f"--worker={kind}", f"--worker_dtype={dtype}",
                   f"--worker_devices={devices}"]
        started[name] = workers.Worker(command, env)
    try:
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(rounds):
            for name, worker in started.items():
                times[name].append(worker.seconds_per_step(1))
        digests = {name: worker.describe()["tokens_sha256"] for name, worker in started.items()}
    finally:
        for worker in started.values():
            worker.close()
    result: dict[str, Any] = {}
    for name in trees:
        seconds = statistics.median(times[name])
        result[name] = {"seconds": seconds, "sentences_per_s": NUM_SENTENCES / seconds,
                        "compile_s": started[name].ready["compile_s"], "round_seconds": times[name]}
    if "before" in trees:
        for name in trees:
            if name != "before":
                result[name]["speedup"] = result["before"]["seconds"] / result[name]["seconds"]
                result[name]["round_speedups"] = [b / o for b, o in zip(times["before"], times[name])]
                result[name]["sentences_as_before"] = sum(
                    b == o for b, o in zip(digests["before"], digests[name]))
                same_devices = f"before, {trees[name][2]} devices"
                if same_devices in trees and name != same_devices:
                    result[name]["speedup_same_devices"] = (result[same_devices]["seconds"] /
                                                            result[name]["seconds"])
    return result


def run(repeats: int = 3, with_reference: bool = True, baseline: str | None = BASELINE_REVISION,
        rounds: int = 5, dtypes: tuple[str, ...] = ("",), devices: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """Beam-4 and greedy sentences/s, ours (in each of `dtypes`, '' = the model's float32, on each count of
    CPU `devices`) against `baseline` (a git revision, on one device and on each count; None: ours alone)."""
    summary: dict[str, Any] = {"baseline_revision": baseline, "rounds": rounds}
    with tempfile.TemporaryDirectory() as directory:
        trees = {contender_name(dtype, count): (REPO, dtype, count) for count in devices for dtype in dtypes}
        before = baseline_tree(baseline, directory) if baseline else None
        if before:
            # The earlier revision's search split over the same devices: how much of a gain is the split.
            trees = {"before": (before, "", 1), **{f"before, {count} devices": (before, "", count)
                                                    for count in devices if count > 1}, **trees}
        summary["decoders"] = {kind: compare(kind, trees, rounds) for kind in DECODERS}
    if with_reference:
        params, src = inputs()
        cached = measure(beam_decoder(cached_step), params, src, repeats)
        reference = measure(beam_decoder(prefix_step), params, src, 1)
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
    # Imported here: workers of an earlier revision import this file but never call this.
    from transformer_jax.run.sharding import automatic_cpu_devices

    return 1 << (automatic_cpu_devices().bit_length() - 1)


def contender_name(dtype: str, devices: int = 1) -> str:
    """'ours' for the model's own dtype on one device, else e.g. 'ours bfloat16, 2 devices'."""
    return ("ours" + (f" {dtype}" if dtype else "") + (f", {devices} devices" if devices > 1 else ""))


def print_summary(result: dict[str, Any]) -> None:
    """The decode section's table: sentences/s before and ours (per dtype), and the ratios."""
    for kind, row in result["decoders"].items():
        for name, ours in row.items():
            if name.startswith("before"):
                if name != "before":
                    print(f"{DECODERS[kind]:<32} {name:<24} {ours['sentences_per_s']:7.1f} sentences/s "
                          f"({ours['seconds']:.2f} s)", flush=True)
                continue
            line = (f"{DECODERS[kind]:<32} {name:<24} {ours['sentences_per_s']:7.1f} sentences/s "
                    f"({ours['seconds']:.2f} s)")
            if "before" in row:
                before = row["before"]
                line += (f" | before ({result['baseline_revision']}) {before['sentences_per_s']:7.1f} sentences/s"
                         f" | /before {ours['speedup']:.2f}x (rounds {min(ours['round_speedups']):.2f}-"
                         f"{max(ours['round_speedups']):.2f}; sentences with the same tokens: "
                         f"{ours['sentences_as_before']}/{NUM_SENTENCES})")
                if "speedup_same_devices" in ours:
                    line += f" | /before on as many devices {ours['speedup_same_devices']:.2f}x"
            print(line, flush=True)
    if "cache_speedup" in result:
        reference = result["reference"]
        print(f"{'beam 4, full forward on the prefix':<32} {reference['sentences_per_s']:7.1f} sentences/s; "
              f"key/value cache speed-up {result['cache_speedup']:.1f}x; same beams: "
              f"{result['same_beams_as_reference']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per decoder")
    parser.add_argument("--baseline", default=BASELINE_REVISION, help="git revision to compare with ('' for none)")
    parser.add_argument("--reference", action="store_true", help="also time the full-prefix reference")
    parser.add_argument("--dtypes", default="", help="comma-separated decoding dtypes of ours ('' = the model's)")
    parser.add_argument("--cpu_devices", default="1",
                        help="comma-separated CPU device counts for ours (rows split over them, as eval.py does)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker_dtype", default="", help=argparse.SUPPRESS)
    parser.add_argument("--worker_devices", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.worker_dtype, args.worker_devices)
        return
    print_summary(run(with_reference=args.reference, baseline=args.baseline or None, rounds=args.rounds,
                      dtypes=tuple(args.dtypes.split(",")),
                      devices=tuple(int(count) for count in args.cpu_devices.split(","))))


if __name__ == "__main__":
    main()
