"""What the per-step stop agreement costs a multi-process run: ms per training step with and without it.

Starts 2 JAX processes on localhost (jax.distributed; gloo collectives on CPU; one CPU device each).
Each builds the Trainer of configs/smoke.py and of a larger model on the same data, then times rounds of
a few updates (20 smoke, 4 larger), alternately with and without a `StopAgreement` call after each
update (as `Trainer.run` makes it), with no log step in between: the case where the check could stall
the asynchronous dispatch most. Also times the check alone (no update in flight: one network round
trip each), and in a process of its own the host's part of a check (no network). Reports the medians
over `--rounds` rounds (default 16), and the median of the per-round ratios (each pair of rounds ran
back to back). That a signal stops every process at the same step, and that a check never waits for
the update in flight, are tests (tests/run/test_preemption.py, test_preemption_signal.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any

import jax
import ml_collections

from benchmarks.workers import REPO, worker_command
from transformer_jax.base import make_mesh
from transformer_jax.run import StopAgreement, StopFlag, Trainer, assemble_run

ROUNDS = 16
PROCESSES = 2


def cases() -> dict[str, tuple[ml_collections.ConfigDict, int]]:
    """{name: (config, updates per timed round)}: the smoke config, and a larger model on the same data."""
    spec = importlib.util.spec_from_file_location("smoke_config", REPO / "configs" / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    smoke, larger = module.get_config(), module.get_config()
    larger.data.update(tokens_per_batch=2048, max_length=64)
    larger.model.update(num_layers=2, d_model=256, d_ff=1024, num_heads=4)
    return {"smoke": (smoke, 20), "larger": (larger, 4)}


def seconds_per_step(trainer: Any, must_stop: Any, steps: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds per update over `steps` updates (each followed by `must_stop()` if given).

    CPU time (this process, all its threads) is less exposed than wall-clock time to other programs
    sharing the machine, and counts what the check makes the host do.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.update()
        if must_stop is not None:
            must_stop()
    jax.block_until_ready(trainer.state)
    return (time.perf_counter() - started) / steps, (time.process_time() - cpu_started) / steps


def measure(name: str, config: ml_collections.ConfigDict, workdir: str, steps: int, rounds: int) -> dict[str, float]:
    """Median ms per step without and with the check, and µs per check alone, for one config."""
    trainer = Trainer(assemble_run(config, os.path.join(workdir, name)))
    must_stop = StopAgreement(StopFlag(), trainer.mesh)
    assert must_stop.collective, "run with several processes: one process checks a local flag only"
    seconds_per_step(trainer, must_stop, 3)  # compile and warm up both
    times: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
    for round_index in range(rounds):
        # ABBA order, so a slow drift of the machine weighs on both alike.
        for mode in (("without", "with") if round_index % 2 == 0 else ("with", "without")):
            times[mode].append(seconds_per_step(trainer, must_stop if mode == "with" else None, steps))
    # Each round's pair ran back to back: their ratio is less exposed to other load than the medians.
    paired = [100 * (w[0] - wo[0]) / wo[0] for w, wo in zip(times["with"], times["without"])]
    wall = {mode: [t[0] for t in rounds_of] for mode, rounds_of in times.items()}
    cpu = {mode: statistics.median(t[1] for t in rounds_of) for mode, rounds_of in times.items()}
    alone = checks_per_second(must_stop, 200)
    trainer.close()
    without, with_check = statistics.median(wall["without"]), statistics.median(wall["with"])
    return {"ms_per_step_without": 1e3 * without, "ms_per_step_with": 1e3 * with_check,
            "overhead_percent": 100 * (with_check - without) / without, "us_per_check_alone": 1e6 / alone,
            "paired_overhead_percent": statistics.median(paired),
            "cpu_ms_per_step_without": 1e3 * cpu["without"], "cpu_ms_per_step_with": 1e3 * cpu["with"],
            "spread_percent": 100 * (max(wall["without"]) - min(wall["without"])) / without}


def checks_per_second(must_stop: Any, checks: int) -> float:
    """Checks per second with no update in flight (each call reads the previous call's agreement)."""
    started = time.perf_counter()
    for _ in range(checks + 1):  # the last call waits for the last timed check
        must_stop()
    return checks / (time.perf_counter() - started)


def host_microseconds_per_check(checks: int = 2000) -> float:
    """The host's cost of one check when the previous one is done: its dispatch and read, no network.

    Measured in a single process with the agreement forced on over its one CPU device.
    """
    must_stop = StopAgreement(StopFlag(), make_mesh(devices=jax.devices()[:1]), collective=True)
    checks_per_second(must_stop, 50)  # compile and warm up
    return 1e6 / checks_per_second(must_stop, checks)


def worker(spec: dict[str, Any]) -> None:
    """One process of the 2-process run (spec["process_id"]: join, measure every case; process 0 writes the
    figures to spec["json"]), or (spec["host"]) the host's cost of a check."""
    if spec.get("host"):
        with open(spec["json"], "w") as f:
            json.dump({"host_us_per_check": host_microseconds_per_check()}, f)
        return
    logging.getLogger().setLevel(logging.WARNING)
    jax.distributed.initialize(f"localhost:{spec['port']}", spec["processes"], spec["process_id"])
    results = {name: measure(name, config, spec["workdir"], steps, spec["rounds"])
               for name, (config, steps) in cases().items()}
    if jax.process_index() == 0:
        with open(spec["json"], "w") as f:
            json.dump(results, f)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The 2-process run, then the host's cost of a check; one line per case."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "figures.json")
        spec = {"processes": PROCESSES, "port": port, "workdir": workdir, "json": path,
                "rounds": 2 if args.quick else args.rounds or ROUNDS}
        processes = [subprocess.Popen(worker_command("preemption", {**spec, "process_id": index}), cwd=REPO, env=env,
                                      stderr=subprocess.DEVNULL if index else None)
                     for index in range(PROCESSES)]
        statuses = [process.wait() for process in processes]
        if any(statuses):
            raise RuntimeError(f"a benchmark process failed: exit statuses {statuses}")
        with open(path) as f:
            result = json.load(f)
        subprocess.run(worker_command("preemption", {"host": True, "json": path}), cwd=REPO, env=env, check=True)
        with open(path) as f:
            result.update(json.load(f))
    for name, r in result.items():
        if name != "host_us_per_check":
            print(f"{name:>6}: median {r['ms_per_step_without']:8.2f} ms/step without the check, "
                  f"{r['ms_per_step_with']:8.2f} with ({r['overhead_percent']:+.2f}%; median of "
                  f"paired rounds {r['paired_overhead_percent']:+.2f}%); the check alone "
                  f"{r['us_per_check_alone']:.0f} µs; spread of rounds without {r['spread_percent']:.0f}%; "
                  f"CPU ms/step of process 0 {r['cpu_ms_per_step_without']:.2f} without, "
                  f"{r['cpu_ms_per_step_with']:.2f} with", flush=True)
    print(f"host cost of one check (dispatch + read of a finished result, no network): "
          f"{result['host_us_per_check']:.1f} µs")
    return result
