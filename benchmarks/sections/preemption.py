"""What the per-step stop agreement costs a multi-process run: ms per training step with and without it.

    python benchmarks/preemption_check.py [--processes=2] [--rounds=16]

Starts `--processes` JAX processes on localhost (jax.distributed; gloo collectives on CPU; one CPU
device each). Each builds the Trainer of configs/smoke.py and of a larger model, then times rounds of
a few updates (20 smoke, 4 larger), alternately with and without a `StopAgreement` call after each update (as
`Trainer.run` makes it), with no log step in between: the case where the check could stall the
asynchronous dispatch most. Also times the check alone (no update in flight: one network round trip
each), and in this process the host's part of a check (no network). Process 0 prints the medians
over rounds, and the median of the per-round ratios (each pair of rounds ran back to back).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cases() -> dict:
    """{name: (config, updates per timed round)}: the smoke config, and a larger model on the same data."""
    sys.path.insert(0, str(ROOT / "configs"))
    from smoke import get_config

    smoke = get_config()
    larger = get_config()
    larger.data.update(tokens_per_batch=2048, max_length=64)
    larger.model.update(num_layers=2, d_model=256, d_ff=1024, num_heads=4)
    return {"smoke": (smoke, 20), "larger": (larger, 4)}


def seconds_per_step(trainer: Any, must_stop: Any, steps: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds per update over `steps` updates (each followed by `must_stop()` if given).

    CPU time (this process, all its threads) is less exposed than wall-clock time to other programs
    sharing the machine, and counts what the check makes the host do.
    """
    import jax

    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.update()
        if must_stop is not None:
            must_stop()
    jax.block_until_ready(trainer.state)
    return (time.perf_counter() - started) / steps, (time.process_time() - cpu_started) / steps


def measure(name: str, config: Any, workdir: str, steps: int, rounds: int) -> dict[str, float]:
    """Median ms per step without and with the check, and µs per check alone, for one config."""
    import jax

    from transformer_jax.training.loop import Trainer
    from transformer_jax.training.preemption import StopAgreement, StopFlag

    trainer = Trainer(config, os.path.join(workdir, name))
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
    started, checks = time.perf_counter(), 200
    for _ in range(checks):
        must_stop()
    jax.block_until_ready(must_stop._pending)
    alone = (time.perf_counter() - started) / checks
    trainer.close()
    without, with_check = statistics.median(wall["without"]), statistics.median(wall["with"])
    return {"ms_per_step_without": 1e3 * without, "ms_per_step_with": 1e3 * with_check,
            "overhead_percent": 100 * (with_check - without) / without, "us_per_check_alone": 1e6 * alone,
            "paired_overhead_percent": statistics.median(paired),
            "cpu_ms_per_step_without": 1e3 * cpu["without"], "cpu_ms_per_step_with": 1e3 * cpu["with"],
            "spread_percent": 100 * (max(wall["without"]) - min(wall["without"])) / without}


def host_microseconds_per_check(checks: int = 2000) -> float:
    """The host's cost of one check when the previous one is done: its dispatch and read, no network.

    Measured in this (single) process with the agreement forced on over its one CPU device.
    """
    os.environ["JAX_PLATFORMS"] = "cpu"  # this process only: it has not imported jax before
    import jax

    from transformer_jax.run.sharding import make_mesh
    from transformer_jax.training.preemption import StopAgreement, StopFlag

    must_stop = StopAgreement(StopFlag(), make_mesh(devices=jax.devices()[:1]), collective=True)
    for _ in range(50):  # compile and warm up
        must_stop()
    started = time.perf_counter()
    for _ in range(checks):
        must_stop()
    return 1e6 * (time.perf_counter() - started) / checks


def worker(args: argparse.Namespace) -> None:
    """One process of the run: join, measure every case, print (process 0)."""
    import logging

    import jax

    logging.getLogger().setLevel(logging.WARNING)
    jax.distributed.initialize(f"localhost:{args.port}", args.processes, args.process_id)
    for name, (config, steps) in cases().items():
        result = measure(name, config, args.workdir, steps, args.rounds)
        if jax.process_index() == 0:
            print(f"{name:>6}: median {result['ms_per_step_without']:8.2f} ms/step without the check, "
                  f"{result['ms_per_step_with']:8.2f} with ({result['overhead_percent']:+.2f}%; median of "
                  f"paired rounds {result['paired_overhead_percent']:+.2f}%); the check alone "
                  f"{result['us_per_check_alone']:.0f} µs; spread of rounds without {result['spread_percent']:.0f}%; "
                  f"CPU ms/step of process 0 {result['cpu_ms_per_step_without']:.2f} without, "
                  f"{result['cpu_ms_per_step_with']:.2f} with", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=16, help="rounds per mode (medians are reported)")
    parser.add_argument("--process_id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_id is not None:
        return worker(args)
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    with tempfile.TemporaryDirectory() as workdir:
        processes = [subprocess.Popen([sys.executable, __file__, f"--processes={args.processes}",
                                       f"--rounds={args.rounds}", f"--process_id={index}",
                                       f"--port={port}", f"--workdir={workdir}"], env=env,
                                      stderr=subprocess.DEVNULL if index else None)
                     for index in range(args.processes)]
        statuses = [process.wait() for process in processes]
    if any(statuses):
        sys.exit(f"a benchmark process failed: exit statuses {statuses}")
    print(f"host cost of one check (dispatch + read of a finished result, no network): "
          f"{host_microseconds_per_check():.1f} µs")


if __name__ == "__main__":
    main()
