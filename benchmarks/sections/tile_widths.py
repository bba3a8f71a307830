"""Row widths on the chip: the base model's train step compiled for a TPU (libtpu) or a GPU (JAX's CUDA plugin)
at packed widths around the chip's tile, at about the paper's 25,000 token slots per update, compared by
XLA's own figures per slot (on a GPU, XLA's cost model run on this host over the optimized GPU program).

The rule in transformer_jax/data/shapes.py (PLATFORM_WIDTH_MULTIPLES: packed training rows on TPU are
multiples of 128) comes from this table: per token slot, the HBM bytes XLA's cost analysis says the step
moves, its FLOPs, and the step's temporary memory, at widths 96, 112, 120, 128 and 256 on v5e-8
(`--tile_topology`; `h100` for one H100: 48 to 256). A width that is not a multiple of 128 lays the attention scores' key axis over
partly empty lanes. Compile-only (JAX's CPU platform, libtpu's topology); each compile takes minutes on
2 cores.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from benchmarks.sections.aot import load_config  # noqa: E402
from transformer_jax.aot import (  # noqa: E402
    describe,
    mesh_for,
    program_of,  # noqa: E402
)
from transformer_jax.data import PACKED_KEYS, BatchShapes  # noqa: E402
from transformer_jax.run import build_run  # noqa: E402

# Widths compared around each platform's tile, at about 25,000 token slots an update.
WIDTHS = {"tpu": (96, 112, 120, 128, 256), "gpu": (48, 64, 96, 112, 128, 192, 256)}
SLOTS = 25_000
VOCAB = 37_000


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Compile the base train step at each width; print and return bytes and FLOPs per slot and temporaries."""
    topology = describe(args.tile_topology)
    mesh = mesh_for(topology, -1, 1)
    config = load_config("base")
    results = {}
    print(f"base train step, {args.tile_topology} ({len(topology.devices)} devices), {config.model.dtype}, vocab {VOCAB}; "
          "XLA's figures per device")
    print(f"{'rows x width':>13} {'slots':>7} {'HBM bytes/slot':>15} {'MFLOP/slot':>11} {'temporaries':>12} "
          f"{'compile':>8}")
    widths = WIDTHS["gpu" if topology.chip.is_gpu else "tpu"]
    for width in widths[:2] if args.quick else widths:
        rows = max(1, round(SLOTS / width / mesh.size)) * mesh.size
        batches = BatchShapes(train=((rows, width),), train_keys=PACKED_KEYS, dev_loss=((mesh.size, 128),),
                              translation=(mesh.size, 128))
        started = time.perf_counter()
        [(name, lowered)] = build_run(config, mesh, VOCAB, batches).lower_train()
        program = program_of(name, lowered.compile())
        slots = rows * width
        figures = {"rows": rows, "width": width, "slots": slots, "bytes_per_slot": program.bytes_accessed / slots,
                   "flops_per_slot": program.flops / slots, "temporary_bytes": program.temp_bytes,
                   "compile_seconds": round(time.perf_counter() - started, 1)}
        results[f"{rows}x{width}"] = figures
        print(f"{rows:>7} x {width:<4} {slots:>7,} {figures['bytes_per_slot'] / 1e3:>12.1f} KB "
              f"{figures['flops_per_slot'] / 1e6:>11.1f} {program.temp_bytes / 1e9:>9.2f} GB "
              f"{figures['compile_seconds']:>7.0f}s", flush=True)
    best = min(results.values(), key=lambda figures: figures["bytes_per_slot"])
    print(f"fewest HBM bytes per slot: width {best['width']}")
    return {"topology": args.tile_topology, "shapes": results, "fewest_bytes_width": best["width"]}
