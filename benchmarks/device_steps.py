"""The accelerators section's timings on this host's GPU or TPU: our train step (with the platform's attention
kernel and the projected loss; with XLA's attention instead of the kernel; as it was before both) and the Flax
WMT example's, on the same packed batches, one after the other in this process. ms per update after warm-up
(the mean of `steps` updates, each waited for), target token slots per second, and XLA's planned peak memory
of each compiled step. Then both beam searches (ours and the example's predict_step with decode.py) on the
same random source batch with random parameters: ms per search and per output position, the output lengths,
and the planned peak memory.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.stages
import numpy as np

WIDTH = 256


def packed_batch(rows: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of two pairs each (100 and 140 tokens) and 16 padding tokens, with positions and segment ids."""
    from transformer_jax.model import BOS_ID, PAD_ID

    rng = np.random.default_rng(seed)
    segments = np.zeros((rows, WIDTH), np.int32)
    segments[:, :100], segments[:, 100:240] = 1, 2
    positions = np.where(segments == 1, np.arange(WIDTH), np.arange(WIDTH) - 100) * (segments > 0)
    tokens = np.where(segments > 0, rng.integers(4, vocab, size=(rows, WIDTH)), PAD_ID).astype(np.int32)
    shifted = np.where(segments > 0, np.where(positions == 0, BOS_ID, np.roll(tokens, 1, axis=1)), PAD_ID)
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
    from transformer_jax.base import global_batch, make_mesh
    from transformer_jax.run import build_run_for

    config = load_config("base")
    config.data.tokens_per_batch = rows * WIDTH
    if contender in ("ours before", "ours, einsum attention"):
        config.model.attention_backend = "einsum"
    if contender == "ours before":
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
    return _step_figures(contender, rows, seconds, compile_s, compiled)


def time_flax(checkout: str, rows: int, steps: int) -> dict[str, Any]:
    """The Flax WMT example's train step at `rows` x 256 on this host's devices."""
    from benchmarks.peer_flax import example_config, load_example, train_step_function
    from benchmarks.sections.aot import load_config
    from transformer_jax.base import global_batch, make_mesh
    from transformer_jax.model import TransformerConfig

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
    return _step_figures("flax", rows, seconds, compile_s, compiled)


def _compiled_figures(contender: str, rows: int, compile_s: float, compiled: Any) -> dict[str, Any]:
    """Who ran where, and XLA's planned peak memory (arguments + outputs - donated + temporaries + code)."""
    from transformer_jax.aot import program_of

    program = program_of(contender, compiled)
    return {"contender": contender, "device": jax.devices()[0].device_kind, "rows": rows,
            "compiled_peak_gb": program.total_bytes / 1e9, "temp_gb": program.temp_bytes / 1e9,
            "compile_s": round(compile_s, 1)}


def _step_figures(contender: str, rows: int, seconds: float, compile_s: float, compiled: Any) -> dict[str, Any]:
    """A train step's figures (printed): ms per update and token slots per second, with the compiled ones."""
    figures = {**_compiled_figures(contender, rows, compile_s, compiled), "ms_per_update": seconds * 1e3,
               "tokens_per_second": rows * WIDTH / seconds}
    print(figures, flush=True)
    return figures


def time_contenders(checkout: str, rows_list: str, steps: int) -> list[dict[str, Any]]:
    """Every contender at every rows of `rows_list` (comma-separated)."""
    results = []
    for rows in (int(r) for r in rows_list.split(",")):
        for contender in ("ours", "ours, einsum attention", "ours before"):
            results.append(time_ours(contender, rows, steps))
        results.append(time_flax(checkout, rows, steps))
        ours, flax = results[-4], results[-1]
        print(f"{rows} rows: " + ", ".join(f"{r['contender']} {r['ms_per_update']:.1f} ms" for r in results[-4:])
              + f": ours / Flax {ours['ms_per_update'] / flax['ms_per_update']:.2f}", flush=True)
    return results


def _concrete(tree: Any, vocab: int, seed: int) -> Any:
    """Arrays for abstract arguments, placed with their shardings: keys, token ids in [4, vocab), small normals."""
    rng = np.random.default_rng(seed)

    def one(x: Any) -> Any:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            value = jax.random.key(int(rng.integers(1 << 30)))
        elif np.issubdtype(x.dtype, np.integer):
            value = rng.integers(4, vocab, size=x.shape).astype(x.dtype)
        else:
            value = (rng.standard_normal(x.shape) * 0.05).astype(x.dtype)
        return jax.device_put(value, x.sharding)

    return jax.tree.map(one, tree)


def _timed_search(contender: str, lowered: Any, vocab: int, repeats: int) -> dict[str, Any]:
    """A lowered search compiled, run once, then timed `repeats` times (the median) on random arguments."""
    started = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - started
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), lowered.args_info[0],
                            compiled.input_shardings[0], is_leaf=lambda x: isinstance(x, jax.stages.ArgInfo))
    args = _concrete(abstract, vocab, 0)
    out = jax.block_until_ready(compiled(*args))
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        seconds.append(time.perf_counter() - started)
    ids = np.asarray(out)
    lengths = (ids > 0).sum(-1)
    median = float(np.median(seconds))
    figures = {**_compiled_figures(contender, ids.shape[0], compile_s, compiled), "search": "beam 4",
               "ms_per_search": median * 1e3, "output_width": ids.shape[1], "mean_output_tokens": float(lengths.mean()),
               "ms_per_output_position": median * 1e3 / ids.shape[1]}
    print(figures, flush=True)
    return figures


def time_searches(checkout: str, repeats: int = 3, translation: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Our beam search (the preflight's: beam 4, alpha 0.6, up to source + 50 tokens, the run's decoding
    precision) and the example's, at the preflight's translation batch (or `translation`: rows, source width)."""
    from benchmarks.peer_flax import lower_search
    from benchmarks.sections.aot import load_config
    from transformer_jax.base import make_mesh
    from transformer_jax.config import decode_options, decoding_dtype
    from transformer_jax.run import build_run_for

    config = load_config("base")
    programs = build_run_for(config, make_mesh())
    if translation is not None:
        programs = dataclasses.replace(programs, shapes=dataclasses.replace(programs.shapes, translation=translation))
    rows, width = programs.shapes.translation
    vocab = programs.model_config.vocab_size
    ours = _timed_search("ours", programs.lower_search(decode_options(config), decoding_dtype(config))[1], vocab,
                         repeats)
    # Random parameters: ours ran every search to its full length on the H100; the example's stopped at once, so its
    # end-of-sentence id is one no token has, and both searches make every output position.
    flax = _timed_search("flax", lower_search(checkout, programs.model_config, programs.mesh, rows, width, eos_id=-1),
                         vocab, repeats)
    print(f"search {rows}x{width}: ours {ours['ms_per_search']:.0f} ms, Flax {flax['ms_per_search']:.0f} ms: "
          f"ours / Flax {ours['ms_per_search'] / flax['ms_per_search']:.2f}", flush=True)
    return [ours, flax]
