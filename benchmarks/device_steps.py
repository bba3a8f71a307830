"""The accelerators section's timings on this host's GPU or TPU: our train step (with the platform's attention
kernel and the projected loss, and as it was before them) and the Flax WMT example's, on the same packed
batches, one after the other in this process. ms per update after warm-up (the mean of `steps` updates, each
waited for), target token slots per second, and XLA's planned peak memory of each compiled step.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

WIDTH = 256


def packed_batch(rows: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of two pairs each (100 and 140 tokens) and 16 padding tokens, with positions and segment ids."""
    rng = np.random.default_rng(seed)
    segments = np.zeros((rows, WIDTH), np.int32)
    segments[:, :100], segments[:, 100:240] = 1, 2
    positions = np.where(segments == 1, np.arange(WIDTH), np.arange(WIDTH) - 100) * (segments > 0)
    tokens = rng.integers(4, vocab, size=(rows, WIDTH)).astype(np.int32) * (segments > 0)
    shifted = np.where(positions == 0, 2, np.roll(tokens, 1, axis=1)) * (segments > 0)
    return {"inputs": tokens, "targets": tokens, "target_inputs": shifted.astype(np.int32),
            "inputs_position": positions.astype(np.int32), "targets_position": positions.astype(np.int32),
            "inputs_segmentation": segments, "targets_segmentation": segments}


def _timed(step: Any, carry: tuple, batch: Any, steps: int) -> tuple[float, tuple]:
    for _ in range(3):
        carry = step(*carry, batch)
    jax.block_until_ready(carry)
    started = time.perf_counter()
    for _ in range(steps):
        carry = step(*carry, batch)
    jax.block_until_ready(carry)
    return (time.perf_counter() - started) / steps, carry


def time_ours(contender: str, rows: int, steps: int) -> dict[str, Any]:
    """Our train step (the run builder's, configs/wmt14_ende_base.py) at `rows` x 256 on this host's devices."""
    from benchmarks.sections.aot import load_config
    from transformer_jax.base.sharding import global_batch, make_mesh
    from transformer_jax.training.programs import build_run_for

    config = load_config("base")
    config.data.tokens_per_batch = rows * WIDTH
    if contender == "ours before":
        config.model.attention_backend = "einsum"
        config.training.loss_chunk_tokens = 0
    programs = build_run_for(config, make_mesh())
    state = programs.init_state()
    host = packed_batch(rows, programs.model_config.vocab_size)
    batch = global_batch({k: host[k] for k in programs.shapes.train_keys}, programs.mesh)
    started = time.perf_counter()
    compiled = programs.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - started

    def step(state: Any, batch: Any) -> tuple:
        return (programs.train_step(state, batch)[0],)

    seconds, _ = _timed(step, (state,), batch, steps)
    return _figures(contender, rows, seconds, compile_s, compiled)


def time_flax(checkout: str, rows: int, steps: int) -> dict[str, Any]:
    """The Flax WMT example's train step at `rows` x 256 on this host's devices."""
    from benchmarks.peer_flax import example_config, load_example, train_step_function
    from benchmarks.sections.aot import load_config
    from transformer_jax.base.sharding import global_batch, make_mesh
    from transformer_jax.model.config import TransformerConfig

    models = load_example(checkout)
    model = TransformerConfig(**{**load_config("base").model.to_dict(), "vocab_size": 37000})
    init, step = train_step_function(models, example_config(models, model, max_len=WIDTH), 0.1, 4000, model.d_model)
    mesh = make_mesh()
    host = packed_batch(rows, model.vocab_size)
    names = ("inputs", "targets", "inputs_position", "targets_position", "inputs_segmentation", "targets_segmentation")
    batch = global_batch({k: host[k] for k in names}, mesh)
    params, opt_state = jax.jit(init)(jax.random.key(0), {k: v[:1] for k, v in host.items() if k in names})
    rng = jax.random.key(1)
    jitted = jax.jit(step, donate_argnums=(0, 1))
    started = time.perf_counter()
    compiled = jitted.lower(params, opt_state, batch, rng).compile()
    compile_s = time.perf_counter() - started

    def one(params: Any, opt_state: Any, batch: Any) -> tuple:
        return jitted(params, opt_state, batch, rng)[:2]

    seconds, _ = _timed(one, (params, opt_state), batch, steps)
    return _figures("flax", rows, seconds, compile_s, compiled)


def _figures(contender: str, rows: int, seconds: float, compile_s: float, compiled: Any) -> dict[str, Any]:
    memory = compiled.memory_analysis()
    peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
    device = jax.devices()[0]
    figures = {"contender": contender, "device": device.device_kind, "rows": rows, "ms_per_update": seconds * 1e3,
               "tokens_per_second": rows * WIDTH / seconds, "compiled_peak_gb": peak / 1e9,
               "temp_gb": memory.temp_size_in_bytes / 1e9, "compile_s": round(compile_s, 1)}
    print(figures, flush=True)
    return figures


def time_contenders(checkout: str, rows_list: str, steps: int) -> list[dict[str, Any]]:
    """Every contender at every rows of `rows_list` (comma-separated)."""
    results = []
    for rows in (int(r) for r in rows_list.split(",")):
        for contender in ("ours", "ours before"):
            results.append(time_ours(contender, rows, steps))
        results.append(time_flax(checkout, rows, steps))
        ours, flax = results[-3], results[-1]
        print(f"{rows} rows: ours {ours['ms_per_update']:.1f} ms, ours before {results[-2]['ms_per_update']:.1f} ms, "
              f"Flax {flax['ms_per_update']:.1f} ms: ours / Flax {ours['ms_per_update'] / flax['ms_per_update']:.2f}",
              flush=True)
    return results
