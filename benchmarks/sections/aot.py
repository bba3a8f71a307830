"""The TPU and GPU table of BENCHMARKS.md: the paper's models compiled for TPU topologies and NVIDIA GPUs on a
CPU host (`--aot_models`, `--aot_topologies`; h100 and h100-8 need JAX's CUDA plugin, see docs/scaling.md).

For each (model, topology): configs/wmt14_ende_<model>.py's train step compiled by libtpu (the `tpu` extra;
for GPUs, by JAX's CUDA plugin from the GPU's stored target config) at the paper's batch, ~25,000 target
tokens per update (or one 256-token row per device where the topology has more devices than that batch
has rows), on a data-parallel mesh (an fsdp mesh when that does not fit), through `compile_run`, the
preflight's (`python -m transformer_jax.aot`) compile of the run builder's programs. A second compile at
twice the rows per device gives the activation memory per row, from which the largest per-device batch
that fits is extrapolated (linear in rows; labelled as such). Speeds are rooflines
(transformer_jax/aot/report.py), not measurements. Each compile takes minutes on 2 cores. Runs in a
worker process on JAX's CPU platform (compile-only devices, never a local accelerator).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import tempfile
import time
from typing import Any

import ml_collections

from benchmarks.workers import REPO, worker_command
from transformer_jax.aot import PAPER_TOKENS_PER_STEP, Topology, compile_run, describe, mesh_for, table, verdict


def load_config(model: str) -> ml_collections.ConfigDict:
    """configs/wmt14_ende_<model>.py's run config."""
    path = REPO / "configs" / f"wmt14_ende_{model}.py"
    spec = importlib.util.spec_from_file_location(f"wmt14_ende_{model}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def compile_at(config: ml_collections.ConfigDict, topology: Topology, rows_per_device: int, fsdp: int,
               seconds: list[float]) -> tuple[Any, Any, Any, Any]:
    """The train step's (mesh, shapes, programs, verdict) at `rows_per_device` rows of data.max_length tokens;
    appends its compile time to `seconds`."""
    started = time.perf_counter()
    mesh = mesh_for(topology, -1, fsdp)
    config.data.tokens_per_batch = rows_per_device * mesh.size * config.data.max_length
    config.mesh.update(data=-1, fsdp=fsdp)
    shapes, programs = compile_run(config, mesh, which=("train",))
    seconds.append(round(time.perf_counter() - started, 1))
    return mesh, shapes, programs, verdict(shapes, programs, topology, config.training.accumulation_steps)


def row(model: str, topology_name: str) -> tuple[dict[str, Any], str]:
    """Compile one (model, topology) at the paper's batch and at twice its rows; the table's figures and the
    report of the paper-batch train step (as `python -m transformer_jax.aot` prints it, less dev loss and decoding)."""
    topology = describe(topology_name)
    config = load_config(model)
    devices = len(topology.devices)
    paper_rows = max(1, PAPER_TOKENS_PER_STEP // config.data.max_length // devices)
    started = time.perf_counter()
    seconds: list[float] = []
    for fsdp in (1, devices):
        mesh, shapes, programs, result = compile_at(config, topology, paper_rows, fsdp, seconds)
        if result.fits:
            break
    report = table(topology, mesh, shapes, programs, result, config.training.accumulation_steps)
    _, _, _, doubled = compile_at(config, topology, 2 * paper_rows, fsdp, seconds)
    per_row = (doubled.peak_bytes - result.peak_bytes) / paper_rows
    fixed = result.peak_bytes - per_row * paper_rows
    largest = int((result.hbm_bytes - fixed) // per_row) if per_row > 0 else None
    train = programs[0]
    return {
        "model": model, "topology": topology.name, "type": topology_name, "chip": topology.chip.name,
        "chips": topology.chips, "devices": devices, "hosts": topology.hosts,
        "mesh": f"data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']}",
        "tokens_per_update": shapes.rows * shapes.width, "rows_per_device": paper_rows,
        "peak_gb": result.peak_bytes / 1e9, "hbm_gb": result.hbm_bytes / 1e9, "fits": result.fits,
        "xla_tflop": result.xla_flops / 1e12, "analytic_tflop": result.analytic_flops / 1e12,
        "collectives": {op: [count, size] for op, (count, size) in train.collectives.items()},
        "step_ms": result.step_seconds * 1e3, "compute_ms": result.compute_seconds * 1e3,
        "memory_ms": result.memory_seconds * 1e3, "tokens_per_second": result.tokens_per_second,
        "paper_hours": 100_000 * PAPER_TOKENS_PER_STEP / result.tokens_per_second / 3600,
        "activation_gb_per_row": per_row / 1e9, "largest_rows_per_device": largest,
        "compile_seconds": time.perf_counter() - started, "compile_seconds_each": seconds,
        "attention": config.model.attention_backend, "dtype": config.model.dtype,
    }, report + ("\nfits" if result.fits else "\ndoes not fit")


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown."""
    lines = ["| model | topology | chips / hosts | mesh | tokens per update (rows/device) | peak memory per device "
             "| XLA / analytic TFLOP | collectives (train step) | roofline ms per update (compute, memory) "
             "| tokens/s | paper 100k steps | largest rows/device (extrapolated) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        collectives = ", ".join(f"{op} ×{count} ({size / 1e9:.2f} GB)"
                                for op, (count, size) in sorted(r["collectives"].items()))
        where = r["type"] if r["type"] == r["topology"] else f"{r['type']} ({r['topology']})"
        lines.append(
            f"| {r['model']} | {where} | {r['chips']} / {r['hosts']} | {r['mesh']} "
            f"| {r['tokens_per_update']:,} ({r['rows_per_device']}) | {r['peak_gb']:.2f} of {r['hbm_gb']:.1f} GB "
            f"| {r['xla_tflop']:.1f} / {r['analytic_tflop']:.1f} | {collectives or 'none'} "
            f"| {r['step_ms']:.1f} ({r['compute_ms']:.1f}, {r['memory_ms']:.1f}) | {r['tokens_per_second']:,.0f} "
            f"| {r['paper_hours']:.1f} h | {r['largest_rows_per_device']} |")
    return "\n".join(lines)


def worker(spec: dict[str, Any]) -> None:
    """Every (model, topology) of spec, each row's report printed (and written where spec["reports"] says);
    the rows to spec["json"]."""
    rows = []
    for model in spec["models"]:
        for topology in spec["topologies"]:
            figures, report = row(model, topology)
            rows.append(figures)
            print(report, flush=True)
            print(json.dumps(figures), flush=True)
            if spec["reports"]:
                pathlib.Path(spec["reports"].format(model=model, topology=topology)).write_text(report + "\n")
    print(markdown(rows))
    with open(spec["json"], "w") as f:
        json.dump(rows, f)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The table's rows, compiled in a worker on the CPU platform."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "aot.json")
        spec = {"models": args.aot_models.split(","), "topologies": args.aot_topologies.split(","),
                "reports": args.aot_reports, "json": path}
        subprocess.run(worker_command("aot", spec), cwd=REPO, env=env, check=True)
        with open(path) as f:
            return json.load(f)
