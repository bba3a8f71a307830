"""Train-step throughput of ours and the PyTorch peer on the same shapes, timed alternately, and MFU.

Ours is the run builder's train step (`build_run`: the paper's Adam and schedule, label smoothing 0.1)
on one device; the peer is PyTorch's `nn.Transformer` with the same dimensions and recipe
(benchmarks/peer_torch.py). Each contender runs in its own worker process; they are timed in
alternating rounds of `--steps` steps on the same random batch, each timing preceded by a 1 s pause;
the figure is the median round. CPU: the small config and the base model against the peer. GPU: base
and big in bfloat16 with fused attention at 25,600 target tokens per step, ours alone (the registry's
PyTorch wheel is CPU-only).

MFU = analytic FLOPs of the step (`transformer_jax.model.train_step_flops`) / seconds per step / the
device's peak matmul rate measured in the same run (`peak_matmul_flops`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import workers
from benchmarks.corpora import synthetic_batch
from benchmarks.models import BASE, SMALL, on_gpu, one_device_run
from transformer_jax import TransformerConfig
from transformer_jax.base import global_batch
from transformer_jax.model import model_flops_utilization, train_step_flops

ROUNDS = 7


@dataclasses.dataclass(frozen=True)
class Case:
    """A model and a batch shape to time."""

    name: str
    config: TransformerConfig
    rows: int
    length: int
    peer: bool = True  # also time the PyTorch peer (CPU only: the registry's wheel is CPU-only)

    def batch(self) -> dict[str, np.ndarray]:
        return synthetic_batch(self.rows, self.length, self.config.vocab_size)


def train_cases(quick: bool) -> list[Case]:
    """CPU: small config and base shapes against the peer. GPU: base and big in bfloat16 at ~25k tokens/step."""
    if on_gpu():
        fast = {"dtype": "bfloat16", "attention_backend": "fused"}
        return [Case("base, bfloat16, 25,600 target tokens", BASE.replace(**fast), 200, 128, peer=False),
                Case("big, bfloat16, 25,600 target tokens", TransformerConfig.preset("big", vocab_size=37000, **fast),
                     200, 128, peer=False)]
    cases = [Case("small (N=2, d_model 128, vocab 4,000), 64 x 64", SMALL, 64, 64)]
    if not quick:
        cases.append(Case("base (N=6, d_model 512, vocab 37,000), 16 x 64", BASE, 16, 64))
    return cases


def peak_matmul_flops(dtype: Any = jnp.float32, size: int | None = None, repeats: int = 10) -> float:
    """The best rate of a square matmul on the default device (FLOP/s): the MFU denominator."""
    size = size or (8192 if on_gpu() else 2048)
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(matmul(a, a))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a, a))
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def our_train_step(config: TransformerConfig, batch: dict[str, np.ndarray]) -> Callable[[], None]:
    """A closure running one (synchronized) train step of the run builder (compiled on its first call)."""
    programs = one_device_run(config)
    placed = global_batch(batch, programs.mesh)
    holder = {"state": programs.init_state()}

    def step() -> None:
        holder["state"], metrics = programs.train_step(holder["state"], placed)
        jax.block_until_ready(metrics)

    return step


def compare(case: Case, started: dict[str, workers.Worker], peak: float, rounds: int, steps_per_round: int,
            settle_s: float = 1.0) -> dict[str, Any]:
    """Seconds per step of each worker (medians of alternating rounds), tokens/s, MFU, ratio ours/peer.

    `started` maps "ours" (and "peer") to workers running `case`. Each timing waits `settle_s` first, so
    that threads the previous contender left spinning (OpenMP, Eigen) have gone to sleep and do not
    compete with the one being timed.
    """
    flops = train_step_flops(case.config, case.rows, case.length, case.length)
    tokens = case.rows * case.length
    samples: dict[str, list[float]] = {name: [] for name in started}
    for _ in range(rounds):  # alternate, so both see the same machine conditions
        for name, worker in started.items():
            time.sleep(settle_s)
            samples[name].append(worker.seconds_per_step(steps_per_round))
    result: dict[str, Any] = {"case": case.name, "target_tokens_per_step": tokens, "flops_per_step": flops}
    for name, times in samples.items():
        seconds = statistics.median(times)
        result[f"{name}_compile_s"] = started[name].ready["compile_s"]
        result[f"{name}_s_per_step"] = seconds
        result[f"{name}_round_s_per_step"] = times
        result[f"{name}_tokens_per_s"] = tokens / seconds
        result[f"{name}_mfu"] = model_flops_utilization(flops, seconds, peak)
        result[f"{name}_memory"] = started[name].memory()
    if "peer" in started:
        result["ratio_ours_over_peer"] = result["ours_tokens_per_s"] / result["peer_tokens_per_s"]
        # The same ratio round by round (each round times both back to back): its spread shows the noise.
        result["round_ratios"] = [p / o for o, p in zip(samples["ours"], samples["peer"])]
    return result


def worker(spec: dict[str, Any]) -> None:
    """A train-step worker process for one contender ("ours" or "peer") and case."""
    case = train_cases(spec["quick"])[spec["case"]]
    baseline = workers.peak_rss_bytes()

    def build() -> Callable[[], Any]:
        if spec["impl"] == "peer":
            from benchmarks.peer_torch import peer_train_step

            return peer_train_step(case.config, case.batch())
        return our_train_step(case.config, case.batch())

    def memory() -> dict[str, Any]:
        result = {"peak_rss_bytes": workers.peak_rss_bytes(), "rss_after_imports_bytes": baseline}
        if on_gpu() and spec["impl"] == "ours":
            result["peak_device_bytes"] = jax.devices()[0].memory_stats()["peak_bytes_in_use"]
        return result

    workers.serve(build, memory)


def memory_line(case: Case, impl: str, memory: dict[str, Any]) -> str:
    """One contender's peak memory, as the table prints it."""
    if "peak_device_bytes" in memory:
        figure = f"peak device memory {memory['peak_device_bytes'] / 2**30:.2f} GiB"
    else:
        above = (memory["peak_rss_bytes"] - memory["rss_after_imports_bytes"]) / 2**20
        figure = f"peak RSS {memory['peak_rss_bytes'] / 2**20:,.0f} MiB ({above:,.0f} MiB above the imports)"
    return f"{case.name:<48} {impl:<5} {figure}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every case, ours against the peer; the measured matmul peak; each contender's memory."""
    dtype = jnp.bfloat16 if on_gpu() else jnp.float32
    peak = peak_matmul_flops(dtype)
    print(f"measured peak matmul rate ({jnp.dtype(dtype).name}): {peak / 1e12:.3f} TFLOP/s")
    rows, memory_lines = [], []
    for index, case in enumerate(train_cases(args.quick)):
        started = {impl: workers.Worker(workers.worker_command("train", {"impl": impl, "case": index,
                                                                         "quick": args.quick}))
                   for impl in (("ours", "peer") if case.peer else ("ours",))}
        try:
            result = compare(case, started, peak, rounds=args.rounds or ROUNDS, steps_per_round=args.steps)
        finally:
            for started_worker in started.values():
                started_worker.close()
        rows.append(result)
        line = f"{case.name:<48} ours {result['ours_tokens_per_s']:>9,.0f} tok/s  MFU {result['ours_mfu']:6.1%}"
        if case.peer:
            line += (f" | peer {result['peer_tokens_per_s']:>9,.0f} tok/s  MFU {result['peer_mfu']:6.1%}"
                     f" | ours/peer {result['ratio_ours_over_peer']:.2f}"
                     f" (rounds {min(result['round_ratios']):.2f}-{max(result['round_ratios']):.2f})")
        print(line, flush=True)
        if on_gpu():
            days = 100_000 * 25_000 / result["ours_tokens_per_s"] / 86_400
            result["paper_base_schedule_days"] = days
            print(f"  the paper's schedule (100k steps x 25k tokens) at this rate: {days:.2f} days")
        memory_lines += [memory_line(case, impl, result[f"{impl}_memory"]) for impl in started]
    print("memory (each contender in its own process):")
    print("\n".join(memory_lines))
    return {"peak_matmul_flops": {"dtype": jnp.dtype(dtype).name, "flops_per_s": peak}, "cases": rows}
