"""`scan_layers` and `remat`: compile time, XLA's temporary memory and step time of the run builder's train step.

The train section's last case (on CPU the base model at 16 x 64 tokens; --quick: the small one), each of
scan_layers in (False, True) x remat in (none, dots, full), compiled and timed in this process.
"XLA temporary memory" is `compiled.memory_analysis().temp_size_in_bytes`: activations and scratch,
without parameters and optimizer state.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax

from benchmarks.models import one_device_run
from benchmarks.sections.train import train_cases
from transformer_jax import TransformerConfig
from transformer_jax.base import global_batch


def compile_and_time(config: TransformerConfig, batch: dict[str, Any], steps: int) -> dict[str, float]:
    """Compile time, XLA's temporary (activation) memory and seconds per step of one configuration."""
    programs = one_device_run(config)
    state = programs.init_state()
    batch = global_batch(batch, programs.mesh)
    start = time.perf_counter()
    compiled = programs.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    return {"compile_s": compile_s, "temp_bytes": float(memory.temp_size_in_bytes),
            "s_per_step": (time.perf_counter() - start) / steps}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The six combinations, one line each."""
    case = train_cases(args.quick)[-1]
    batch = case.batch()
    rows = []
    for scan in (False, True):
        for remat in ("none", "dots", "full"):
            config = case.config.replace(scan_layers=scan, remat=remat)
            result = compile_and_time(config, batch, steps=2 if args.quick else 3)
            result.update(scan_layers=scan, remat=remat)
            rows.append(result)
            print(f"{case.name:<48} scan_layers={scan!s:<5} remat={remat:<4}  compile {result['compile_s']:5.1f} s  "
                  f"XLA temp memory {result['temp_bytes'] / 2**20:8,.0f} MiB  step {result['s_per_step']:.3f} s",
                  flush=True)
    return rows
