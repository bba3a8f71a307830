"""The search programs compiled for GPUs without one: kernels per step of the decoding loop, and peak memory.

The run builder's beam search (beam 4, alpha 0.6) and greedy search of `configs/wmt14_ende_base.py`
(bfloat16 compute, float32 parameters, an 8k vocabulary as the lease's Multi30k run) at the preflight's
translation batch, lowered and compiled for the CUDA plugin's compile-only H100 and H200 (no GPU needed:
`pip install --no-deps jax-cuda12-plugin==<jax> jax-cuda12-pjrt==<jax>`). Each program compiles in a fresh
worker process. Per program, read from the compiled HLO (each `while` body's instructions, once per trip):
  kernels/step   the instructions of the loop body that run as kernels (fusions, custom calls, sorts, copies;
                 a conditional counted as its larger branch)
  conds/step     conditionals in the loop body: on a GPU each one copies its predicate to the host and waits
  host/step      transfers between device and host in the loop body (sends, receives, feeds, host callbacks)
  outside        kernels before and after the loop (the encoder, the cache's creation)
  peak           XLA's memory analysis: arguments + outputs + temporaries, against the chip's HBM
  compile s      lowering + XLA's compile on this host (a GPU host's own compile also autotunes)
Each target and mode also compiles the search at the batch `score`/`translate` size for that GPU when none is
given ("sized": evaluation/device_batches.py at the chip's HBM, sources of SIZED_WIDTH tokens).
Run with `JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1` and the CUDA plugin importable. The comparison
with revision 79f3ef3 (before the searches' changes for GPUs) is in docs/benchmarks/history.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from typing import Any

from benchmarks import workers

TARGETS = ("h100", "h200")
MODES = ("beam", "greedy")
VOCAB = 8000
# The source width of the device-sized rows (ours only): the width data.shapes sizes the batches at.
SIZED_WIDTH = 32
# Instructions that launch nothing: they name, pick or alias buffers (as sections/accelerators.py counts).
# Instructions that move data between the device and the host (a host callback's custom call included).
HOST_TRANSFERS = ("send", "recv", "send-done", "recv-done", "infeed", "outfeed")
BOOKKEEPING = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "copy-start", "copy-done",
               "after-all", "opt-barrier")


def computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    """Each computation's instruction lines by name, and the entry's name."""
    bodies: dict[str, list[str]] = {}
    entry, name = "", None
    for line in hlo.splitlines():
        header = re.match(r"^(ENTRY )?%?(\S+) .*\{\s*$", line)
        if header:
            name = header.group(2)
            bodies[name] = []
            entry = name if header.group(1) else entry
        elif line.startswith("}"):
            name = None
        elif name:
            bodies[name].append(line)
    return bodies, entry


def _opcode(line: str) -> str | None:
    match = re.match(r"\s*(?:ROOT )?%\S+ = .*?\s([a-z][a-z\-]*)\(", line)
    return match.group(1) if match else None


def kernels(bodies: dict[str, list[str]], name: str) -> dict[str, int]:
    """Kernels, conditionals and sorts that one run of computation `name` launches; loops inside it apart."""
    counts = {"kernels": 0, "conditionals": 0, "sorts": 0, "loops": 0, "host_transfers": 0}
    for line in bodies[name]:
        opcode = _opcode(line)
        if opcode is None or opcode in BOOKKEEPING:
            continue
        if opcode == "while":
            counts["loops"] += 1
        elif opcode == "conditional":
            branches = re.findall(r"(?:branch_computations=\{|true_computation=|false_computation=|, )%([\w.\-]+)",
                                  line.split("conditional(", 1)[1])
            inner = [kernels(bodies, branch) for branch in branches if branch in bodies]
            counts["conditionals"] += 1
            counts["kernels"] += max((branch["kernels"] for branch in inner), default=0)
        else:
            counts["kernels"] += 1
            counts["sorts"] += opcode == "sort" or " sort(" in "".join(bodies.get(_called(line), []))
            counts["host_transfers"] += opcode in HOST_TRANSFERS or "callback" in line
    return counts


def _called(line: str) -> str:
    match = re.search(r"calls=%([\w.\-]+)", line)
    return match.group(1) if match else ""


def loop_figures(hlo: str) -> dict[str, Any]:
    """The figures of the docstring for a program with one decoding loop."""
    bodies, entry = computations(hlo)
    loops = [line for line in bodies[entry] if _opcode(line) == "while"]
    if len(loops) != 1:
        raise ValueError(f"expected one while loop in the search's entry, found {len(loops)}")
    body = re.search(r"body=%([\w.\-]+)", loops[0]).group(1)
    step = kernels(bodies, body)
    return {"kernels_per_step": step["kernels"], "conditionals_per_step": step["conditionals"],
            "sorts_per_step": step["sorts"], "loops_in_step": step["loops"], "host_transfers_per_step": step["host_transfers"],
            "outside": kernels(bodies, entry)["kernels"], "hlo_chars": len(hlo)}


def worker(spec: dict[str, Any]) -> None:
    """Compile one search for one GPU kind; print its figures as one JSON line."""
    from benchmarks.sections.aot import load_config
    from transformer_jax.aot import describe, mesh_for, run_programs
    from transformer_jax.config import decode_options, decoding_dtype

    config = load_config("base")
    config.data.vocab_size = VOCAB
    topology = describe(spec["target"])
    mesh = mesh_for(topology, -1, 1)
    started = time.perf_counter()
    programs = run_programs(config, mesh)
    options = decode_options(config)
    options = options.replace(mode="greedy") if spec["mode"] == "greedy" else options
    dtype = decoding_dtype(config)
    if spec.get("sized"):  # the batch score/translate search in on this GPU when none is given
        from transformer_jax.config import translation_batching
        from transformer_jax.evaluation import sized_batching

        batching = sized_batching(translation_batching(config), programs.model_config, options, dtype, mesh,
                                  memory=topology.chip.hbm_bytes)[0]
        name, lowered = programs.lower_search(options, dtype, SIZED_WIDTH, batching=batching)
    else:
        name, lowered = programs.lower_search(options, dtype)
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    peak = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
    figures = loop_figures(compiled.as_text())
    print(json.dumps({**spec, "program": name, "compile_s": round(time.perf_counter() - started, 1),
                      "peak_gb": round(peak / 1e9, 2), "hbm_gb": topology.chip.hbm_bytes / 1e9, **figures}))


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One program in a fresh process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    output = subprocess.run(workers.worker_command("search_kernels", spec), cwd=workers.REPO, env=env,
                            capture_output=True, text=True)
    if output.returncode != 0:
        lines = output.stderr.strip().splitlines() or ["no output"]
        return {**spec, "error": next((line for line in reversed(lines) if "error" in line.lower()), lines[-1])[:200]}
    return json.loads(output.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every target and mode, at the preflight's batch and at the device-sized one, one line each."""
    from transformer_jax.aot import describe
    from transformer_jax.errors import ConfigError

    try:
        describe(TARGETS[0])  # the CUDA plugin's compile-only devices, or why there are none
    except ConfigError as error:
        print(f"search_kernels: skipped, {error}")
        return {"skipped": str(error)}
    results: dict[str, Any] = {"ours": [], "sized": []}
    for target in TARGETS[:1] if args.quick else TARGETS:
        for mode in MODES:
            for name, sized in (("ours", False), ("sized", True)):
                result = measure({"target": target, "mode": mode, "sized": sized})
                results[name].append(result)
                print(f"{name:<6} {target} {mode:<6} " + (
                    f"error: {result['error']}" if "error" in result else
                    f"{result['program']}: {result['kernels_per_step']} kernels/step, "
                    f"{result['conditionals_per_step']} conds/step, {result['sorts_per_step']} sorts/step, "
                    f"{result.get('host_transfers_per_step', '-')} host transfers/step, "
                    f"{result['outside']} outside, peak {result['peak_gb']} of {result['hbm_gb']:.0f} GB, "
                    f"compile {result['compile_s']} s"), flush=True)
    return results
