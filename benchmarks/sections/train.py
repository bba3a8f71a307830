"""Train-step throughput of ours and the PyTorch peer on the same shapes, timed alternately, and MFU.

MFU = analytic FLOPs of the step (`transformer_jax.model.flops`) / seconds per step / the device's peak
matmul rate measured in the same run (`peak_matmul_flops`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model.flops import model_flops_utilization, train_step_flops
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import create_train_state
from transformer_jax.training.step import train_step


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


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A full (unpadded) batch of random ids, targets shifted right after BOS."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, vocab, size=(rows, length), dtype=np.int32)
    shifted = np.concatenate([np.full((rows, 1), 2, np.int32), tokens[:, :-1]], axis=1)
    return {"inputs": tokens, "targets": tokens, "target_inputs": shifted}


def peak_matmul_flops(dtype: Any = jnp.float32, size: int | None = None, repeats: int = 10) -> float:
    """The best rate of a square matmul on the default device (FLOP/s): the MFU denominator."""
    on_gpu = jax.devices()[0].platform != "cpu"
    size = size or (8192 if on_gpu else 2048)
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
    """A closure running one (synchronized) train step (compiled on its first call)."""
    model = Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model))
    state = jax.jit(lambda: create_train_state(model, optimizer, seed=0))()
    step_fn = jax.jit(train_step, static_argnums=2, donate_argnums=0)
    device_batch = jax.device_put(batch)
    holder = {"state": state}

    def step() -> None:
        holder["state"], metrics = step_fn(holder["state"], device_batch, 0.1)
        jax.block_until_ready(metrics)

    return step


def compare(case: Case, workers: dict[str, Any], peak: float, rounds: int, steps_per_round: int,
            settle_s: float = 1.0) -> dict[str, Any]:
    """Seconds per step of each worker (medians of alternating rounds), tokens/s, MFU, ratio ours/peer.

    `workers` maps "ours" (and "peer") to started `workers.Worker`s running `case`. Each timing waits
    `settle_s` first, so that threads the previous contender left spinning (OpenMP, Eigen) have gone
    to sleep and do not compete with the one being timed.
    """
    flops = train_step_flops(case.config, case.rows, case.length, case.length)
    tokens = case.rows * case.length
    samples: dict[str, list[float]] = {name: [] for name in workers}
    for _ in range(rounds):  # alternate, so both see the same machine conditions
        for name, worker in workers.items():
            time.sleep(settle_s)
            samples[name].append(worker.seconds_per_step(steps_per_round))
    result: dict[str, Any] = {"case": case.name, "target_tokens_per_step": tokens, "flops_per_step": flops}
    for name, times in samples.items():
        seconds = statistics.median(times)
        result[f"{name}_compile_s"] = workers[name].ready["compile_s"]
        result[f"{name}_s_per_step"] = seconds
        result[f"{name}_round_s_per_step"] = times
        result[f"{name}_tokens_per_s"] = tokens / seconds
        result[f"{name}_mfu"] = model_flops_utilization(flops, seconds, peak)
        result[f"{name}_memory"] = workers[name].memory()
    if "peer" in workers:
        result["ratio_ours_over_peer"] = result["ours_tokens_per_s"] / result["peer_tokens_per_s"]
        # The same ratio round by round (each round times both back to back): its spread shows the noise.
        result["round_ratios"] = [p / o for o, p in zip(samples["ours"], samples["peer"])]
    return result


def compile_and_time(config: TransformerConfig, batch: dict[str, jax.Array], steps: int) -> dict[str, float]:
    """Compile time, XLA's temporary (activation) memory and seconds per step of one configuration."""
    model = Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model))
    state = jax.jit(lambda: create_train_state(model, optimizer, seed=0))()
    start = time.perf_counter()
    compiled = jax.jit(train_step, static_argnums=2, donate_argnums=0).lower(state, batch, 0.1).compile()
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
