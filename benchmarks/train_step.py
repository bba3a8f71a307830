"""Train-step throughput: target tokens per second of the jitted, donated train step.

  python benchmarks/train_step.py [--steps 20] [--json PATH]

Measures the demo model on its real batch shape (packed 64 x 64 rows from the built-in corpus) and the
paper's base model on a small batch, after compilation, with the batch already on the device, so the
figure is the step alone (the input pipeline is measured by benchmarks/input_pipeline.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import numpy as np

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.training import create_train_state, paper_learning_rate, paper_optimizer, train_step

CASES = {
    # name: (model config, rows, length)
    "demo (d_model 128, 2 layers, vocab 4000)": (
        TransformerConfig(vocab_size=4000, num_layers=2, d_model=128, d_ff=512, num_heads=4, max_len=128),
        64, 64,
    ),
    "base (d_model 512, 6 layers, vocab 37000)": (TransformerConfig(vocab_size=37000), 8, 64),
}


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A full (unpadded) batch of random ids, targets shifted right after BOS."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, vocab, size=(rows, length), dtype=np.int32)
    shifted = np.concatenate([np.full((rows, 1), 2, np.int32), tokens[:, :-1]], axis=1)
    return {"inputs": tokens, "targets": tokens, "target_inputs": shifted}


def measure(config: TransformerConfig, rows: int, length: int, steps: int) -> dict[str, float]:
    """Compile once, then time `steps` updates; returns tokens/s and seconds per step."""
    model = Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model))
    state = jax.jit(lambda: create_train_state(model, optimizer, seed=0))()
    step = jax.jit(train_step, static_argnums=2, donate_argnums=0)
    batch = jax.device_put(synthetic_batch(rows, length, config.vocab_size))
    start = time.perf_counter()
    state, metrics = step(state, batch, 0.1)
    jax.block_until_ready(metrics)
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch, 0.1)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - start) / steps
    return {"target_tokens_per_step": rows * length, "seconds_per_step": seconds,
            "target_tokens_per_second": rows * length / seconds, "compile_seconds": compile_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    device = jax.devices()[0]
    print(f"device: {device.device_kind} x{jax.device_count()} ({platform.processor() or platform.machine()}), "
          f"jax {jax.__version__}")
    results = {}
    print(f"{'case':45s} {'tokens/step':>11s} {'s/step':>8s} {'tokens/s':>10s} {'compile s':>9s}")
    for name, (config, rows, length) in CASES.items():
        result = measure(config, rows, length, args.steps)
        results[name] = result
        print(f"{name:45s} {result['target_tokens_per_step']:11d} {result['seconds_per_step']:8.3f} "
              f"{result['target_tokens_per_second']:10.0f} {result['compile_seconds']:9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device.device_kind), "jax": jax.__version__, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
