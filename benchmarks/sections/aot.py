"""The TPU and GPU table of BENCHMARKS.md and the README: the paper's models compiled for real TPU topologies
and NVIDIA GPUs on a CPU host.

  python benchmarks/aot_table.py [--models base,big] [--topologies v5e-8,v5e-256,...] [--json PATH]
  JAX_PLATFORMS=cpu python benchmarks/aot_table.py --topologies h100,h100-8   # needs jax[cuda12] (see README)

For each (model, topology): configs/wmt14_ende_<model>.py's train step compiled by libtpu (the `tpu`
extra; for GPUs, by JAX's CUDA plugin from the GPU's stored target config) at the paper's batch,
~25,000 target tokens per update (or one 256-token row per device where
the topology has more devices than that batch has rows), on a data-parallel mesh (an fsdp mesh when
that does not fit). A second compile at twice the rows per device gives the activation memory per
row, from which the largest per-device batch that fits is extrapolated (linear in rows; labelled as
such). Speeds are rooflines (see transformer_jax/aot/report.py), not measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_jax.aot.compile import compile_run  # noqa: E402
from transformer_jax.aot.report import PAPER_TOKENS_PER_STEP, table, verdict  # noqa: E402
from transformer_jax.aot.topology import describe, mesh_for  # noqa: E402

TOPOLOGIES = ("v5e-8", "v5e-256", "v4-128", "v5p-128", "v6e-64")


def load_config(model: str):
    """configs/wmt14_ende_<model>.py's run config."""
    path = ROOT / "configs" / f"wmt14_ende_{model}.py"
    spec = importlib.util.spec_from_file_location(f"wmt14_ende_{model}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def compile_at(config, topology, rows_per_device: int, fsdp: int, seconds: list[float]):
    """The train step's verdict at `rows_per_device` rows of data.max_length tokens; appends its compile time."""
    started = time.perf_counter()
    mesh = mesh_for(topology, -1, fsdp)
    config.data.tokens_per_batch = rows_per_device * mesh.size * config.data.max_length
    config.mesh.update(data=-1, fsdp=fsdp)
    shapes, programs = compile_run(config, mesh, which=("train",))
    seconds.append(round(time.perf_counter() - started, 1))
    return mesh, shapes, programs, verdict(shapes, programs, topology, config.training.accumulation_steps)


def row(model: str, topology_name: str) -> tuple[dict, str]:
    """Compile one (model, topology) at the paper's batch and at twice its rows; the table's figures and the
    report of the paper-batch train step (as `python -m transformer_jax.aot` prints it, less dev loss and decoding)."""
    topology = describe(topology_name)
    config = load_config(model)
    devices = len(topology.devices)
    paper_rows = max(1, PAPER_TOKENS_PER_STEP // config.data.max_length // devices)
    started = time.perf_counter()
    seconds = []
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


def markdown(rows: list[dict]) -> str:
    """The table as Markdown."""
    lines = ["| model | topology | chips / hosts | mesh | tokens per update (rows/device) | peak memory per device "
             "| XLA / analytic TFLOP | collectives (train step) | roofline ms per update (compute, memory) "
             "| tokens/s | paper 100k steps | largest rows/device (extrapolated) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        collectives = ", ".join(f"{op} ×{count} ({size / 1e9:.2f} GB)" for op, (count, size) in sorted(r["collectives"].items()))
        where = r["type"] if r["type"] == r["topology"] else f"{r['type']} ({r['topology']})"
        lines.append(
            f"| {r['model']} | {where} | {r['chips']} / {r['hosts']} | {r['mesh']} "
            f"| {r['tokens_per_update']:,} ({r['rows_per_device']}) | {r['peak_gb']:.2f} of {r['hbm_gb']:.1f} GB "
            f"| {r['xla_tflop']:.1f} / {r['analytic_tflop']:.1f} | {collectives or 'none'} "
            f"| {r['step_ms']:.1f} ({r['compute_ms']:.1f}, {r['memory_ms']:.1f}) | {r['tokens_per_second']:,.0f} "
            f"| {r['paper_hours']:.1f} h | {r['largest_rows_per_device']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="base,big")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--json", default=None, help="append each row to this JSON-lines file")
    parser.add_argument("--reports", default=None,
                        help="write each row's report to this path, {model} and {topology} filled in")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for topology in args.topologies.split(","):
            figures, report = row(model, topology)
            rows.append(figures)
            print(report, flush=True)
            print(json.dumps(rows[-1]), flush=True)
            if args.reports:
                pathlib.Path(args.reports.format(model=model, topology=topology)).write_text(report + "\n")
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
