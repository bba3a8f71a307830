"""Decoding on the lease: sentences/s per search mode after compiling, the compile seconds, a profile of one batch.

    python -m benchmarks.lease.decode --workdir RUN --sources FILE --out DIR [--sentences 1000,100000]
        [--modes beam,greedy] [--batch_size N --batch_tokens T]

For each mode, through the public `Translator` (the batching `translate` and `score` use when none is given:
sized for the devices), it translates the distinct source lines once (every translation width's program
compiles there: JAX's backend-compile events are summed as "compile s"), then the lines repeated to each
count of --sentences, timed after compiling ("sentences/s": a count's own shapes compiled in its pass are
timed by the same events and taken out). Then one batch of beam search (the widest the timed run
used, at most 4,096 sentences) is traced with jax.profiler into DIR/search_trace and read back per batch as the
training profile is (`summarize_trace`: the device's busy time, kernels, the top 10, the host's launch calls).
Prints one line per mode and the profile's lines, and writes DIR/decode.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Any

import jax

from transformer_jax.evaluation import Translator
from transformer_jax.run import newest_trace, read_trace, summarize_trace

# The step marker of the traced search batch (what summarize_trace counts, as it counts updates in training).
SEARCH_STEP = "search"
BACKEND_COMPILE_SUFFIX = "backend_compile_duration"
PROFILED_SENTENCES = 4096


class CompileClock:
    """The seconds XLA spends compiling while it listens (JAX's backend-compile duration events)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._heard)

    def _heard(self, event: str, duration: float, **_: Any) -> None:
        if event.endswith(BACKEND_COMPILE_SUFFIX):
            self.seconds += duration


def timed_mode(translator: Translator, mode: str, distinct: list[str], counts: list[int], clock: CompileClock,
               batching: dict[str, int]) -> list[dict[str, Any]]:
    """One mode: the first pass over the distinct lines (compiles), then a timed pass over each count of them."""
    compiled_before, start = clock.seconds, time.perf_counter()
    translator.translate(distinct, mode=mode, **batching)
    first_pass = time.perf_counter() - start
    compile_s = clock.seconds - compiled_before
    rows = []
    for count in counts:
        lines = (distinct * -(-count // len(distinct)))[:count]
        compiled, start = clock.seconds, time.perf_counter()
        outputs = translator.translate(lines, mode=mode, **batching)
        # A count gives shapes of its own (fewer rows than a batch, widths merged otherwise): their compile is
        # timed by the same events and taken out.
        recompiled = clock.seconds - compiled
        seconds = time.perf_counter() - start - recompiled
        rows.append({"mode": mode, "sentences": count, "seconds": seconds, "sentences_per_second": count / seconds,
                     "compile_s": compile_s + recompiled, "first_pass_s": first_pass,
                     "compiled_in_timed_pass_s": recompiled, "empty_outputs": sum(not t for t in outputs)})
    return rows


def profile_batch(translator: Translator, lines: list[str], directory: str, batching: dict[str, int]) -> dict[str, Any]:
    """One search batch (beam) traced into `directory`, summarized; {} when the profiler gives no trace."""
    rows = batching.get("batch_size") or translator.batching_for(translator.search(mode="beam")).batch_size
    batch = lines[:min(len(lines), PROFILED_SENTENCES, rows)]
    translator.translate(batch, mode="beam", **batching)  # compiled, and the devices idle before the trace
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    try:
        with jax.profiler.StepTraceAnnotation(SEARCH_STEP, step_num=1):
            translator.translate(batch, mode="beam", **batching)  # returns text: the devices have finished
    finally:
        jax.profiler.stop_trace()
    trace = newest_trace(directory)
    if trace is None:
        return {}
    summary = summarize_trace(read_trace(trace), step_name=SEARCH_STEP)
    return {**summary.to_json(), "sentences": len(batch), "trace": trace,
            "lines": [line.replace("update(s)", "search batch(es)").replace("update", "batch")
                      for line in summary.lines()]}


def decode_figures(workdir: str, sources: list[str], counts: list[int], modes: list[str], out: str,
                   batching: dict[str, int]) -> dict[str, Any]:
    """Every mode timed at every count, then the profile; the figures as a dict (see the module docstring)."""
    distinct = list(dict.fromkeys(line for line in sources if line.strip()))
    clock = CompileClock()
    with Translator(workdir) as translator:
        results = {"batching": dict(batching), "device": jax.devices()[0].device_kind, "modes": []}
        for mode in modes:
            used = batching or dataclasses.asdict(translator.batching_for(translator.search(mode=mode)))
            for row in timed_mode(translator, mode, distinct, counts, clock, batching):
                row["batching"] = used
                results["modes"].append(row)
                print(f"decode {mode:<6} {row['sentences']:>7} sentences: {row['sentences_per_second']:8,.0f} "
                      f"sentences/s after compiling ({row['seconds']:.1f} s), compile {row['compile_s']:.1f} s",
                      flush=True)
        lines = (distinct * -(-PROFILED_SENTENCES // len(distinct)))[:PROFILED_SENTENCES]
        results["search_profile"] = profile_batch(translator, lines, os.path.join(out, "search_trace"), batching)
    print("\n".join(results["search_profile"].get("lines") or ["search profile: none written"]))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="a trained run's directory")
    parser.add_argument("--sources", required=True, help="a file of source lines (repeated to --sentences)")
    parser.add_argument("--out", required=True, help="where decode.json and the profile go")
    parser.add_argument("--sentences", default="1000,100000", help="sentences timed per mode, comma-separated counts")
    parser.add_argument("--modes", default="beam,greedy", help="search modes timed, comma-separated")
    parser.add_argument("--batch_size", type=int, default=None, help="default: sized for the devices")
    parser.add_argument("--batch_tokens", type=int, default=None, help="default: sized for the devices")
    args = parser.parse_args(argv)
    with open(args.sources, encoding="utf-8") as f:
        sources = f.read().splitlines()
    batching = {key: value for key, value in (("batch_size", args.batch_size), ("batch_tokens", args.batch_tokens))
                if value is not None}
    os.makedirs(args.out, exist_ok=True)
    counts = [int(count) for count in args.sentences.split(",")]
    results = decode_figures(args.workdir, sources, counts, args.modes.split(","), args.out, batching)
    with open(os.path.join(args.out, "decode.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
