"""Our train step against the Flax WMT example's on the chips users rent, by the compilers' own figures, and timed
where this host has the chip (`--flax_checkout DIR`: a google/flax checkout; `--accel_runs`).

Each run is `model@topology` (default base@v5e-8, big@v5p-8, base@h100; h100 needs JAX's CUDA plugin, see
docs/scaling.md). For each, three train steps are compiled at the paper's batch (~25,000 target tokens per
update: rows of 256 tokens per device) by libtpu, or the CUDA plugin for GPUs:
  * ours: the preflight's step (configs/wmt14_ende_<model>.py through the run builder): on TPUs splash
    attention and on GPUs XLA's fused attention ("auto"; cuDNN's once proven there); the loss by the fused Pallas kernels on TPUs (training/loss_kernel.py,
    no logits in HBM), projected a chunk of tokens at a time on GPUs;
  * ours, remat full: the same step with `model.remat=full` (each layer keeps only its input and recomputes
    its forward pass in the backward pass);
  * ours, remat dots: the same step with `model.remat=dots` (each layer keeps its matmul outputs for the
    backward pass and recomputes the rest);
  * ours, fsdp (and with remat dots): the parameters and Adam's moments sharded over the chips
    (`mesh.data=1, mesh.fsdp=-1`); multi-chip topologies only;
  * ours before: the same with the einsum attention and the whole batch's float32 logits (the step as it was
    before these kernels, and as it still is on CPUs, but for the accelerators' dropout draws);
  * Flax: examples/wmt/models.py with the same sizes (benchmarks/peer_flax.py).
And the beam search of each (ours, and the example's predict_step with decode.py), at the preflight's
translation batch. Figures per device: peak memory (arguments + outputs - donated + temporaries + code), XLA's bytes accessed
and FLOPs, the roofline, [B, H, T, T] buffers left in device memory (read from the compiled HLO: every
instruction outside fusions is a buffer in HBM), the kernels the step runs (instructions outside fusions that
launch: on GPUs each costs a launch, which small batches feel), and the largest rows per device that fit (a second
compile at twice the rows; linear in rows), and on TPUs the compiler's own estimated step time (aot/cycles.py: the
cycles libtpu estimates for each instruction at the TensorCore clock, the Pallas kernels at their roofline,
collectives left out). Splash gives XLA no FLOPs, so "kernel FLOPs" adds the attention's analytic count where it
runs, and one more forward for each splash forward call beyond the backward ones (remat runs a layer's attention
again in the backward pass); the fused loss kernels carry a cost estimate, which XLA's figures include.

On a host whose JAX backend is a GPU or TPU, the section also times the steps there (ms per update, after
warm-up, real arrays; ours also with XLA's attention in place of the kernel) and both beam searches
(benchmarks/device_steps.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import tempfile
import time
from typing import Any

from benchmarks.workers import REPO, worker_command

RUNS = "base@v5e-8,big@v5p-8,base@h100"
CONTENDERS = ("ours", "ours, remat dots", "ours, remat full", "ours, fsdp", "ours, fsdp, remat dots", "ours before",
              "flax")
# Contenders that are ours with other run settings: (mesh.fsdp, model.remat). fsdp -1: parameters and Adam's
# moments sharded over every chip (mesh.data=1), as `--config.mesh.data=1 --config.mesh.fsdp=-1` gives.
SETTINGS = {"ours, remat dots": (1, "dots"), "ours, remat full": (1, "full"), "ours, fsdp": (-1, "none"),
            "ours, fsdp, remat dots": (-1, "dots")}
WIDTH = 256


def _rows_per_device(devices: int) -> int:
    from transformer_jax.aot import PAPER_TOKENS_PER_STEP

    return max(1, PAPER_TOKENS_PER_STEP // WIDTH // devices)


def _model(model: str) -> Any:
    from benchmarks.sections.aot import load_config

    return load_config(model)


def mesh_axes(contender: str) -> tuple[int, int]:
    """(mesh.data, mesh.fsdp) of a contender: every chip on the data axis, or on fsdp for SETTINGS' fsdp -1."""
    fsdp = SETTINGS.get(contender, (1, "none"))[0]
    return (1, fsdp) if fsdp == -1 else (-1, fsdp)


def lowered_step(contender: str, model: str, mesh: Any, rows: int, checkout: str) -> tuple[Any, Any]:
    """(lowered train step, model config) of `contender` at `rows` (global) x WIDTH on `mesh`."""
    from transformer_jax.aot import run_programs

    config = _model(model)
    config.data.tokens_per_batch = rows * WIDTH
    config.mesh.data, config.mesh.fsdp = mesh_axes(contender)
    config.model.remat = SETTINGS.get(contender, (1, "none"))[1]
    if contender == "ours before":
        config.model.attention_backend = "einsum"
        config.training.loss_chunk_tokens = 0
    programs = run_programs(config, mesh)
    if contender == "flax":
        from benchmarks.peer_flax import load_example, lower_train_step

        return lower_train_step(load_example(checkout), programs.model_config, mesh, rows, WIDTH), programs.model_config
    return programs.lower_train()[0][1], programs.model_config


def unfused_instructions(hlo: str) -> list[str]:
    """The lines of optimized HLO outside fusion computations (and the reducers' regions): the program's own
    instructions, each a kernel, a copy or bookkeeping, each of its buffers in device memory."""
    lines, computation = [], ""
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%(\S+) ", line)
        if header and line.rstrip().endswith("{"):
            computation = header.group(1)
        elif "fused" not in computation and "region" not in computation:
            lines.append(line)
    return lines


def hbm_buffers(hlo: str) -> list[tuple[list[int], int]]:
    """(dims, bytes) of each array instruction outside fusions in optimized HLO that holds a buffer in device
    memory (HBM): bitcasts move nothing, and S(1) is the TPU core's own vector memory."""
    from transformer_jax.aot import HLO_DTYPE_BYTES

    buffers = []
    for line in unfused_instructions(hlo):
        match = re.match(r"\s*(?:ROOT )?%\S+ = (pred|[suf]\d+|bf16)\[([\d,]+)\](\{[^}]*\})? (\S+)\(", line)
        if match and match.group(4) != "bitcast" and "S(1)" not in (match.group(3) or ""):
            dims = [int(d) for d in match.group(2).split(",")]
            buffers.append((dims, HLO_DTYPE_BYTES.get(match.group(1), 4) * math.prod(dims)))
    return buffers


def scores_in_memory(hlo: str, rows: int, heads: int, width: int = WIDTH) -> tuple[int, int]:
    """(count, bytes) of buffers holding [rows, heads, width, width] attention scores (any layout, any 4+ axes with
    `heads` and two of `width`) in device memory: each is written there and read back."""
    found = [size for dims, size in hbm_buffers(hlo) if dims.count(width) >= 2 and heads in dims and len(dims) >= 4]
    return len(found), sum(found)


def logits_in_memory(hlo: str, vocab: int, d_model: int) -> tuple[int, int]:
    """(count, bytes) of buffers in device memory with a vocabulary-sized axis (or one padded to a multiple of 128)
    that are not [vocabulary, d_model] tables, their gradients or their shards (fsdp): logits, or arrays derived
    from them."""
    sizes = {vocab, -(-vocab // 128) * 128}
    found = [size for dims, size in hbm_buffers(hlo)
             if max(dims) in sizes and math.prod(dims) // max(dims) >= 128 and d_model % (math.prod(dims) // max(dims))]
    return len(found), sum(found)


# Instructions that launch nothing: they name, pick or alias buffers.
BOOKKEEPING = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "copy-start", "copy-done",
               "after-all", "opt-barrier")


def kernels_launched(hlo: str) -> int:
    """Instructions of the program outside fusions that run as kernels of their own (fusions, matmuls, custom
    calls, collectives, copies; a loop's body counted once): on GPUs each is at least one launch, which is
    what small batches pay for."""
    count = 0
    for line in unfused_instructions(hlo):
        match = re.match(r"\s*(?:ROOT )?%\S+ = .*?\s([a-z][a-z\-]*)\(", line)
        count += bool(match) and match.group(1) not in BOOKKEEPING
    return count


def compile_figures(contender: str, model: str, topology_name: str, rows_per_device: int, checkout: str
                    ) -> dict[str, Any]:
    """One contender's compiled train step on a topology: per-device memory, bytes, FLOPs, roofline."""
    from transformer_jax.aot import describe, mesh_for, program_of, program_seconds, splash_flops
    from transformer_jax.model import attention_score_flops, train_step_flops
    from transformer_jax.training import logits_matmul_flops

    topology = describe(topology_name)
    mesh = mesh_for(topology, *mesh_axes(contender))
    rows = rows_per_device * mesh.size
    started = time.perf_counter()
    lowered, model_config = lowered_step(contender, model, mesh, rows, checkout)
    compiled = lowered.compile()
    program = program_of(contender, compiled)
    hlo = compiled.as_text()
    kernels = hlo.count("tpu_custom_call") + hlo.count("__cudnn$fmha")
    # Splash gives XLA no cost estimate (its calls are counted, remat's second forward included); the fused loss
    # kernels do (XLA's FLOPs count them already).
    attention = attention_score_flops(model_config, rows, WIDTH, WIDTH) / mesh.size
    kernel_flops = splash_flops(program, attention)
    scores = scores_in_memory(hlo, rows_per_device, model_config.num_heads)
    logits = logits_in_memory(hlo, model_config.vocab_size, model_config.d_model)
    chip = topology.chip
    estimate, seconds = program.estimate, program_seconds(program, topology, attention)
    return {
        "contender": contender, "model": model, "topology": topology_name, "chip": chip.name,
        "rows_per_device": rows_per_device, "peak_gb": program.total_bytes / 1e9, "temp_gb": program.temp_bytes / 1e9,
        "bytes_gb": program.bytes_accessed / 1e9, "xla_tflop": program.flops / 1e12,
        "kernel_tflop": kernel_flops / 1e12,
        "analytic_tflop": train_step_flops(model_config, rows, WIDTH, WIDTH) / mesh.size / 1e12,
        "compute_ms": (program.flops + kernel_flops) / topology.peak_flops_per_device * 1e3,
        "memory_ms": program.bytes_accessed / topology.hbm_bandwidth_per_device * 1e3,
        "hbm_gb": topology.hbm_bytes_per_device / 1e9, "kernel_calls": kernels,
        "score_buffers": scores[0], "score_buffer_gb": scores[1] / 1e9, "kernels": kernels_launched(hlo),
        "logits_buffers": logits[0], "logits_buffer_gb": logits[1] / 1e9,
        "estimated_mcycles": estimate.cycles / 1e6 if estimate else None,
        "estimated_ms": seconds * 1e3 if seconds else None,
        "recomputed_tflop": (logits_matmul_flops(rows_per_device * WIDTH, model_config.vocab_size,
                                                 model_config.d_model) / 1e12 if program.loss_kernels else 0.0),
        "compile_s": round(time.perf_counter() - started, 1),
    }


def search_figures(contender: str, model: str, topology_name: str, checkout: str) -> dict[str, Any]:
    """The beam search (beam 4, alpha 0.6, outputs up to source + 50 tokens, the compute dtype's caches) of ours
    (the preflight's) or the Flax example's (its predict_step), at the preflight's translation batch."""
    from transformer_jax.aot import describe, mesh_for, program_of, run_programs
    from transformer_jax.config import decode_options, decoding_dtype

    topology = describe(topology_name)
    mesh = mesh_for(topology, -1, 1)
    config = _model(model)
    programs = run_programs(config, mesh)
    rows, width = programs.shapes.translation
    started = time.perf_counter()
    if contender == "flax":
        from benchmarks.peer_flax import lower_search

        lowered = lower_search(checkout, programs.model_config, mesh, rows, width)
    else:
        lowered = programs.lower_search(decode_options(config), decoding_dtype(config))[1]
    program = program_of(contender, lowered.compile())
    return {"contender": contender, "model": model, "topology": topology_name, "sentences": rows, "width": width,
            "peak_gb": program.total_bytes / 1e9, "bytes_gb": program.bytes_accessed / 1e9,
            "xla_tflop": program.flops / 1e12, "compile_s": round(time.perf_counter() - started, 1)}


def largest_rows(at: dict[str, Any], doubled: dict[str, Any]) -> int | None:
    """Rows per device that fit the chip's memory, extrapolated linearly from two compiles."""
    per_row = (doubled["peak_gb"] - at["peak_gb"]) / at["rows_per_device"]
    fixed = at["peak_gb"] - per_row * at["rows_per_device"]
    return int((at["hbm_gb"] - fixed) // per_row) if per_row > 0 else None


def markdown(rows: list[dict[str, Any]]) -> str:
    """Each run's contenders, and ours against Flax as ratios."""
    lines = ["| model @ topology | step | peak GB/device | temporaries GB | XLA bytes accessed GB | XLA (+ kernel) "
             "TFLOP / analytic | roofline ms (compute, memory) | [B,H,T,T] buffers in HBM | logits buffers in HBM "
             "| kernels | largest rows/device | TPU compiler's estimated ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flops = f"{r['xla_tflop']:.3f}" + (f" (+{r['kernel_tflop']:.3f})" if r["kernel_tflop"] else "")
        lines.append(
            f"| {r['model']} @ {r['topology']} | {r['contender']} | {r['peak_gb']:.2f} | {r['temp_gb']:.2f} "
            f"| {r['bytes_gb']:.2f} | {flops} / {r['analytic_tflop']:.3f} "
            f"| {max(r['compute_ms'], r['memory_ms']):.1f} ({r['compute_ms']:.1f}, {r['memory_ms']:.1f}) "
            f"| {r['score_buffers']} ({r['score_buffer_gb']:.2f} GB) "
            f"| {r.get('logits_buffers', '-')} ({r.get('logits_buffer_gb', 0):.2f} GB) | {r.get('kernels', '-')} "
            f"| {r.get('largest_rows', '-')} | {_ms(r.get('estimated_ms'))} |")
    if not any(r["contender"] == "flax" for r in rows):
        return "\n".join(lines)  # no ratios without the Flax example (--accel_contenders)
    lines += ["", "| model @ topology | ours / Flax: bytes accessed | peak memory | largest rows | estimated time "
              "| (XLA + kernel) FLOPs / analytic |", "|---|---|---|---|---|---|"]
    for r in rows:
        if not r["contender"].startswith("ours") or r["contender"] == "ours before":
            continue
        peer = next((p for p in rows if p["contender"] == "flax" and p["topology"] == r["topology"]
                     and p["model"] == r["model"]), None)
        if peer is None:
            continue  # the Flax example was not compiled in this run (--accel_contenders)
        ratio = (f"{r['largest_rows'] / peer['largest_rows']:.2f}" if r.get("largest_rows") and peer.get("largest_rows")
                 else "-")
        time = (f"{r['estimated_ms'] / peer['estimated_ms']:.2f}" if r.get("estimated_ms") and peer.get("estimated_ms")
                else "-")
        lines.append(f"| {r['model']} @ {r['topology']} ({r['contender']}) | {r['bytes_gb'] / peer['bytes_gb']:.2f} "
                     f"| {r['peak_gb'] / peer['peak_gb']:.2f} | {ratio} | {time} "
                     f"| {(r['xla_tflop'] + r['kernel_tflop']) / r['analytic_tflop']:.3f}{_without(r)} |")
    return "\n".join(lines)


def _without(r: dict[str, Any]) -> str:
    """The FLOP ratio without what the loss kernels recompute (the analytic count has one logits matmul)."""
    if not r.get("recomputed_tflop"):
        return ""
    ratio = (r["xla_tflop"] + r["kernel_tflop"] - r["recomputed_tflop"]) / r["analytic_tflop"]
    return f" ({ratio:.3f} without the recomputed logits)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def worker(spec: dict[str, Any]) -> None:
    """Every run of spec compiled (CPU platform, compile-only devices); the figures to spec["json"]."""
    from transformer_jax.aot import describe

    rows = []
    for run in spec["runs"]:
        model, topology = run.split("@")
        devices = len(describe(topology).devices)
        per_device = _rows_per_device(devices)
        for contender in spec.get("contenders") or CONTENDERS:
            if mesh_axes(contender)[1] == -1 and devices == 1:
                continue  # one device: nothing to shard parameters over
            figures = compile_figures(contender, model, topology, per_device, spec["checkout"])
            if contender != "ours before":
                doubled = compile_figures(contender, model, topology, 2 * per_device, spec["checkout"])
                figures["largest_rows"] = largest_rows(figures, doubled)
                figures["doubled"] = doubled
            print(json.dumps(figures), flush=True)
            rows.append(figures)
    searches = [] if spec.get("contenders") else [search_figures(contender, *run.split("@"), spec["checkout"])
                                                   for run in spec["runs"] for contender in ("ours", "flax")]
    print(markdown(rows) + ("\n\n" + search_markdown(searches) if searches else ""), flush=True)
    with open(spec["json"], "w") as f:
        json.dump({"train": rows, "search": searches}, f)


def search_markdown(searches: list[dict[str, Any]]) -> str:
    """The searches' figures and ours against Flax."""
    lines = ["| model @ topology | search | sentences x source tokens | peak GB/device | XLA bytes accessed GB "
             "(each loop's body once) | ours / Flax: peak, bytes |", "|---|---|---|---|---|---|"]
    for r in searches:
        peer = next(p for p in searches if p["contender"] == "flax" and p["topology"] == r["topology"]
                    and p["model"] == r["model"])
        ratio = "" if r is peer else f"{r['peak_gb'] / peer['peak_gb']:.2f}, {r['bytes_gb'] / peer['bytes_gb']:.2f}"
        lines.append(f"| {r['model']} @ {r['topology']} | {r['contender']} | {r['sentences']} x {r['width']} "
                     f"| {r['peak_gb']:.2f} | {r['bytes_gb']:.2f} | {ratio} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The compiled figures (a CPU worker), and the device timings when this host has a GPU or TPU."""
    import jax

    if not args.flax_checkout:
        raise SystemExit("the accelerators section needs --flax_checkout=DIR, a local google/flax checkout")
    result: dict[str, Any] = {}
    if args.accel_runs:
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "accelerators.json")
            chosen = [c.strip() for c in args.accel_contenders.split(";") if c.strip()]
            unknown = sorted(set(chosen) - set(CONTENDERS))
            if unknown:
                raise SystemExit(f"--accel_contenders: unknown {', '.join(unknown)}; "
                                 f"choose from {', '.join(CONTENDERS)}, separated by ';'")
            contenders = [c for c in CONTENDERS if c in chosen] if chosen else []
            spec = {"runs": args.accel_runs.split(","), "checkout": args.flax_checkout, "json": path,
                    "contenders": contenders}
            subprocess.run(worker_command("accelerators", spec), cwd=REPO, env=env, check=True)
            with open(path) as f:
                result["compiled"] = json.load(f)
    if jax.default_backend() in ("gpu", "tpu"):
        from benchmarks.device_steps import time_contenders, time_searches

        result["timed"] = time_contenders(args.flax_checkout, args.accel_timed_rows, 20)
        result["searched"] = time_searches(args.flax_checkout)
    return result
