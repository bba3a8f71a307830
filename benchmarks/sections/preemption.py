"""What the bound on the host's lead costs and what it saves a stop (training.max_updates_in_flight, K).

    python -m benchmarks.run --sections preemption [--quick] [--rounds N]

1. Throughput. Target tokens/s with the bound (K = 2: `StopAgreement.after_update` after each update, as
   `Trainer.run` calls it) and without (a round of updates dispatched before the host waits for them, as a log
   window does), in alternating rounds (ABBA) in the same processes: one process, on the smoke config (a host-bound
   step of milliseconds, where the host's dispatch is the largest share) and on a larger model (about a second an
   update); and 2 processes on localhost (jax.distributed, gloo collectives; one CPU device each), where the bound
   is the stop agreement's own wait and "without" runs no agreement at all.
2. Stop latency. train.py itself (a counter of its updates added, nothing else changed) on the smoke corpus widened
   to updates of about 0.1 to 2 s, one log window of 50 updates; SIGTERM at a random moment 3 to 40 updates after
   the first one, the same moment for both contenders: K = 2, and K = 1,000 (no bound: the host dispatches to the
   window's end, the lead of the loop before the bound). Reported: the seconds from the signal to the checkpoint on
   disk (the run's stop line and timing.jsonl's stop_seconds), to the process's exit, and the steps between.
3. The train step compiled for accelerators this host does not have (libtpu's v5e-8; an H100 when JAX's CUDA plugin
   is importable, e.g. PYTHONPATH holding `pip install --no-deps --target DIR jax-cuda12-plugin==<jax>
   jax-cuda12-pjrt==<jax>`): host transfers inside the program (send/recv, infeed/outfeed, host callbacks), and
   whether the program differs with K = 2 and K = 1,000 (the bound waits between programs, never inside one).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import random
import re
import runpy
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import ml_collections

from benchmarks.workers import REPO, worker_command
from transformer_jax.base import workdir as layout

ROUNDS = 8
PROCESSES = 2
IN_FLIGHT = 2
UNBOUNDED = 1000  # training.max_updates_in_flight's largest value: more than a log window, so no bound at all
WINDOW = 50  # log_every of the stop-latency runs
# The smoke run widened (a 1,000-piece vocabulary, d_model 128, d_ff 512, 4,000 pairs), and the tokens an update
# takes for each update time of the stop-latency table (2 CPU cores, Intel Xeon, 2026-12-07: 0.05, 0.23, 0.46 and
# 0.94 s measured at half these sizes).
WIDER = dict(builtin_train_size=4000, vocab_size=1000, d_model=128, d_ff=512)
TOKENS_FOR = {"0.1 s": 2048, "0.5 s": 8192, "1 s": 16384, "2 s": 32768}
# Host transfers a compiled program could hold: XLA's send/recv and in/outfeed ops, and custom calls into Python.
HOST_TRANSFERS = re.compile(r"\b(?:send|recv|send-done|recv-done|infeed|outfeed)\(|custom_call_target=\"[^\"]*callback")


def smoke_config() -> ml_collections.ConfigDict:
    """configs/smoke.py's run."""
    spec = importlib.util.spec_from_file_location("smoke_config", REPO / "configs" / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def throughput_cases() -> dict[str, tuple[ml_collections.ConfigDict, int]]:
    """{name: (config, updates per timed round)}: the smoke config, and a larger model on the same data."""
    smoke, larger = smoke_config(), smoke_config()
    larger.data.update(tokens_per_batch=2048, max_length=64)
    larger.model.update(num_layers=2, d_model=256, d_ff=1024, num_heads=4)
    return {"smoke": (smoke, 50), "larger": (larger, 6)}


# --- 1. throughput, in worker processes ---------------------------------------------------------------------------

def timed_round(trainer: Any, bound: Any, updates: int) -> tuple[float, float]:
    """(seconds, target tokens) of `updates` updates, each followed by the bound's wait if `bound` is given; the
    round ends when its last update has (a log window's end)."""
    started, tokens = time.perf_counter(), []
    for _ in range(updates):
        metrics = trainer.update()
        tokens.append(metrics["tokens"])
        if bound is not None:
            bound.after_update(metrics["loss"])
    jax.block_until_ready(trainer.state)
    return time.perf_counter() - started, float(sum(jax.device_get(tokens)))


def measure_throughput(name: str, config: ml_collections.ConfigDict, workdir: str, updates: int,
                       rounds: int) -> dict[str, float]:
    """Median tokens/s with and without the bound for one config, and the median of the paired ratios."""
    from transformer_jax.run import StopAgreement, StopFlag, Trainer, assemble_run

    trainer = Trainer(assemble_run(config, os.path.join(workdir, name)))
    bound = StopAgreement(StopFlag(), trainer.mesh, IN_FLIGHT)
    for contender in (bound, None):  # compile and warm up both
        timed_round(trainer, contender, 3)
    rates: dict[str, list[float]] = {"with": [], "without": []}
    for index in range(rounds):
        for mode in (("without", "with") if index % 2 == 0 else ("with", "without")):  # ABBA
            seconds, tokens = timed_round(trainer, bound if mode == "with" else None, updates)
            rates[mode].append(tokens / seconds)
    trainer.close()
    paired = [w / wo for w, wo in zip(rates["with"], rates["without"])]
    return {"tokens_per_second_with": statistics.median(rates["with"]),
            "tokens_per_second_without": statistics.median(rates["without"]),
            "paired_ratio": statistics.median(paired), "updates_per_round": updates, "rounds": rounds,
            "spread_without_percent": 100 * (max(rates["without"]) - min(rates["without"]))
            / statistics.median(rates["without"])}


def throughput_worker(spec: dict[str, Any]) -> None:
    """One process of a throughput run: join (several processes), measure every case; process 0 writes them."""
    logging.getLogger().setLevel(logging.WARNING)
    if spec["processes"] > 1:
        jax.distributed.initialize(f"localhost:{spec['port']}", spec["processes"], spec["process_id"])
    results = {name: measure_throughput(name, config, spec["workdir"], 2 if spec["quick"] else updates,
                                        spec["rounds"])
               for name, (config, updates) in throughput_cases().items()}
    if jax.process_index() == 0:
        with open(spec["json"], "w") as f:
            json.dump(results, f)


def run_throughput(processes: int, rounds: int, quick: bool) -> dict[str, Any]:
    """The throughput cases in `processes` worker processes on localhost."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "figures.json")
        spec = {"mode": "throughput", "processes": processes, "port": port, "workdir": workdir, "json": path,
                "rounds": rounds, "quick": quick}
        workers = [subprocess.Popen(worker_command("preemption", {**spec, "process_id": index}), cwd=REPO, env=env,
                                    stderr=subprocess.DEVNULL if index else None)
                   for index in range(processes)]
        statuses = [worker.wait() for worker in workers]
        if any(statuses):
            raise RuntimeError(f"a benchmark process failed: exit statuses {statuses}")
        with open(path) as f:
            return json.load(f)


# --- 2. stop latency, through train.py --------------------------------------------------------------------------

def train_worker(spec: dict[str, Any]) -> None:
    """train.py with `spec["argv"]`, appending "<updates dispatched> <perf_counter>" to spec["counts"] after each."""
    from transformer_jax.run import Trainer

    update = Trainer.update

    def counted(self: Any) -> Any:
        metrics = update(self)
        self.updates_made = getattr(self, "updates_made", 0) + 1
        with open(spec["counts"], "a") as f:
            f.write(f"{self.updates_made} {time.perf_counter()}\n")
        return metrics

    Trainer.update = counted
    sys.argv = [str(REPO / "train.py"), *spec["argv"]]
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")


def counts_of(path: str) -> list[tuple[int, float]]:
    """The (updates dispatched, perf_counter) lines a train worker wrote so far."""
    if not os.path.exists(path):
        return []
    return [(int(count), float(when)) for count, when in
            (line.split() for line in open(path).read().splitlines() if len(line.split()) == 2)]


def stop_once(workdir: str, tokens: int, in_flight: int, delay_updates: float, update_seconds: float | None
              ) -> dict[str, Any]:
    """train.py stopped by SIGTERM `delay_updates` x `update_seconds` after its first update (the bounded run
    measures `update_seconds` itself when it is None: its dispatches are paced by the devices)."""
    counts, run_dir = os.path.join(workdir, "counts.txt"), os.path.join(workdir, "run")
    argv = [f"--config={REPO / 'configs' / 'smoke.py'}", f"--workdir={run_dir}",
            f"--config.data.builtin_train_size={WIDER['builtin_train_size']}",
            f"--config.data.vocab_size={WIDER['vocab_size']}", f"--config.model.d_model={WIDER['d_model']}",
            f"--config.model.d_ff={WIDER['d_ff']}", f"--config.data.tokens_per_batch={tokens}",
            "--config.training.num_train_steps=1000", f"--config.training.log_every={WINDOW}",
            "--config.training.eval_every=0", "--config.training.checkpoint_every=100000",
            f"--config.training.max_updates_in_flight={in_flight}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    process = subprocess.Popen(worker_command("preemption", {"mode": "train", "argv": argv, "counts": counts}),
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not counts_of(counts) and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    first = counts_of(counts)[0][1] if counts_of(counts) else None
    if first is None:
        raise RuntimeError("train.py made no update: " + process.communicate()[1][-2000:])
    if update_seconds is None:  # paced by the devices: the median interval of the first dispatches
        while len(counts_of(counts)) < 6 and process.poll() is None:
            time.sleep(0.01)
        times = [when for _, when in counts_of(counts)]
        update_seconds = statistics.median(b - a for a, b in zip(times[1:], times[2:]))
    time.sleep(max(0.0, first + delay_updates * update_seconds - time.perf_counter()))
    signalled = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=900)
    exited = time.perf_counter() - signalled
    if process.returncode != 143:
        raise RuntimeError(f"train.py exited {process.returncode}: {stderr[-2000:]}")
    timing = [json.loads(line) for line in open(os.path.join(run_dir, layout.TIMING)).read().splitlines()]
    (stop,) = [t for t in timing if "stop_seconds" in t]
    return {"in_flight": in_flight, "update_seconds": update_seconds, "signal_after_updates": delay_updates,
            "stop_seconds": stop["stop_seconds"], "exit_seconds": exited, "signal_step": stop["signal_step"],
            "checkpoint_step": stop["step"], "dispatched": counts_of(counts)[-1][0]}


def run_stop_latency(rounds: int, quick: bool, seed: int) -> dict[str, list[dict[str, Any]]]:
    """For each update time: `rounds` pairs of stops (bounded, then unbounded, at the same random moment)."""
    chooser = random.Random(seed)
    table: dict[str, list[dict[str, Any]]] = {}
    for name, tokens in (list(TOKENS_FOR.items())[:1] if quick else TOKENS_FOR.items()):
        for _ in range(rounds):
            delay = chooser.uniform(3, 40)
            with tempfile.TemporaryDirectory() as bounded_dir, tempfile.TemporaryDirectory() as unbounded_dir:
                bounded = stop_once(bounded_dir, tokens, IN_FLIGHT, delay, None)
                unbounded = stop_once(unbounded_dir, tokens, UNBOUNDED, delay, bounded["update_seconds"])
            table.setdefault(name, []).append({"bounded": bounded, "unbounded": unbounded})
            for label, row in (("K=2", bounded), ("no bound", unbounded)):
                print(f"  updates of {name:>5} (measured {row['update_seconds']:.2f} s), signal "
                      f"{delay:4.1f} updates in, {label:>8}: checkpoint on disk {row['stop_seconds']:6.1f} s after "
                      f"the signal, exit {row['exit_seconds']:6.1f} s; signal at step {row['signal_step']}, "
                      f"checkpoint of step {row['checkpoint_step']} ({row['dispatched']} dispatched)", flush=True)
    return table


# --- 3. the step compiled for accelerators ------------------------------------------------------------------------

def compiled_worker(spec: dict[str, Any]) -> None:
    """Compile the widened smoke run's train step for spec["topology"] with K = 2 and K = 1,000; write, per K,
    the host transfers in its HLO and the HLO's digest."""
    from transformer_jax.aot import describe, mesh_for, run_programs

    topology = describe(spec["topology"])
    results = {}
    for in_flight in (IN_FLIGHT, UNBOUNDED):
        config = smoke_config()
        config.data.update(vocab_size=WIDER["vocab_size"], tokens_per_batch=8192)
        config.model.update(d_model=WIDER["d_model"], d_ff=WIDER["d_ff"])
        config.training.max_updates_in_flight = in_flight
        programs = run_programs(config, mesh_for(topology, -1, 1))
        texts = [lowered.compile().as_text() for _, lowered in programs.lower_train()]
        results[str(in_flight)] = {"host_transfers": sum(len(HOST_TRANSFERS.findall(text)) for text in texts),
                                   "hlo_sha256": hashlib.sha256("".join(texts).encode()).hexdigest()[:16],
                                   "programs": len(texts)}
    with open(spec["json"], "w") as f:
        json.dump(results, f)


def run_compiled(topology: str) -> dict[str, Any] | str:
    """The compiled train step's figures on `topology`, or why it could not be compiled here."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "compiled.json")
        done = subprocess.run(worker_command("preemption", {"mode": "compiled", "topology": topology, "json": path}),
                              cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode:
            return (done.stderr.strip().splitlines() or ["failed"])[-1]
        with open(path) as f:
            return json.load(f)


# --- the harness's entry points -----------------------------------------------------------------------------------

def worker(spec: dict[str, Any]) -> None:
    """A process this section started (spec["mode"]: throughput, train or compiled)."""
    {"throughput": throughput_worker, "train": train_worker, "compiled": compiled_worker}[spec["mode"]](spec)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The three parts, printed as they finish."""
    rounds = 2 if args.quick else args.rounds or ROUNDS
    result: dict[str, Any] = {"throughput": {}}
    for processes in (1, PROCESSES):
        for name, r in run_throughput(processes, rounds, args.quick).items():
            result["throughput"][f"{name}, {processes} process{'es' if processes > 1 else ''}"] = r
            print(f"  {name:>6}, {processes} process(es): {r['tokens_per_second_with']:9.0f} target tokens/s with "
                  f"the bound (K={IN_FLIGHT}), {r['tokens_per_second_without']:9.0f} without; median of paired rounds "
                  f"{r['paired_ratio']:.3f}x; spread of rounds without {r['spread_without_percent']:.0f}% "
                  f"({r['rounds']} rounds of {r['updates_per_round']} updates each)", flush=True)
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"  stop latency (signal times drawn with seed {seed}):", flush=True)
    pairs = 1 if args.quick else max(1, args.rounds // 4) if args.rounds else 2
    result["stop_latency"] = run_stop_latency(pairs, args.quick, seed)
    result["compiled"] = {}
    for topology in ("v5e-8", "h100"):
        figures = result["compiled"][topology] = run_compiled(topology)
        if isinstance(figures, str):
            print(f"  {topology}: not compiled here ({figures})", flush=True)
            continue
        same = figures[str(IN_FLIGHT)]["hlo_sha256"] == figures[str(UNBOUNDED)]["hlo_sha256"]
        print(f"  {topology}: the train step ({figures[str(IN_FLIGHT)]['programs']} program(s)) holds "
              f"{figures[str(IN_FLIGHT)]['host_transfers']} host transfers with K={IN_FLIGHT} and "
              f"{figures[str(UNBOUNDED)]['host_transfers']} with K={UNBOUNDED}; the same program with both: "
              f"{same} (HLO sha256 {figures[str(IN_FLIGHT)]['hlo_sha256']})", flush=True)
    return result
