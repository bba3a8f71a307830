"""Decoding speed: beam-4 and greedy sentences/s with the key/value cache, and the cache's speed-up
over a beam search that reruns the whole prefix every step (a section of benchmarks/run.py).

Both decoders run the same beam search (`beam_search_loop`, beam 4, alpha 0.6) on the same randomly
initialized model (d_model 256, 3 layers, d_ff 1024, 4 heads, vocabulary 8000) and the same 32
source sentences of 25 tokens; EOS is disabled so that every output is 50 tokens long (25 + 25). The
reference step runs `Transformer.__call__` on the whole prefix padded to 50 every step; the cached
step feeds one position and reuses the encoder output and its keys/values. Compilation is timed
apart. The reference takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.decoding.beam_search import beam_search_loop
from transformer_jax.decoding.cache import cached_step, prefix_step
from transformer_jax.decoding.lengths import max_output_lengths
from transformer_jax.decoding.sampling import greedy_choice, token_loop

CONFIG = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=128)
NUM_SENTENCES, SOURCE_LENGTH, EXTRA_LENGTH = 32, 25, 25
BEAM_SIZE, ALPHA = 4, 0.6
NO_EOS = -1  # no token has this id, so every hypothesis runs to its maximum length


def beam_decoder(make_step: Callable) -> Callable:
    """A jitted (params, src) -> ([B, 1, L] tokens, [B, 1] scores) beam search over `make_step`."""
    output_length = SOURCE_LENGTH + EXTRA_LENGTH

    def decode(params: Any, src_BxS: jax.Array) -> tuple[jax.Array, jax.Array]:
        step_fn, state = make_step(params, CONFIG, src_BxS, BEAM_SIZE, output_length)
        max_lengths_B = max_output_lengths(src_BxS, EXTRA_LENGTH, CONFIG.max_len)
        out = beam_search_loop(step_fn, state, max_lengths_B, beam_size=BEAM_SIZE,
                               output_length=output_length, alpha=ALPHA, eos_id=NO_EOS)
        return out.tokens_BxnxL, out.scores_Bxn

    return jax.jit(decode)


def greedy_decoder() -> Callable:
    """A jitted (params, src) -> [B, L] greedy decoder with the cache."""
    output_length = SOURCE_LENGTH + EXTRA_LENGTH

    def decode(params: Any, src_BxS: jax.Array) -> jax.Array:
        step_fn, state = cached_step(params, CONFIG, src_BxS, 1, output_length)
        max_lengths_B = max_output_lengths(src_BxS, EXTRA_LENGTH, CONFIG.max_len)
        return token_loop(step_fn, state, max_lengths_B, output_length, greedy_choice,
                          jax.random.key(0), eos_id=NO_EOS)[0]

    return jax.jit(decode)


def measure(decoder: Callable, params: Any, src: jax.Array, repeats: int) -> dict[str, Any]:
    """Compile time, then the median wall time of `repeats` runs (and the last output)."""
    start = time.perf_counter()
    compiled = decoder.lower(params, src).compile()
    compile_s = time.perf_counter() - start
    times, output = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        output = jax.block_until_ready(compiled(params, src))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"compile_s": compile_s, "seconds": seconds, "runs": repeats,
            "sentences_per_s": NUM_SENTENCES / seconds, "output": output}


def run(repeats: int = 3, with_reference: bool = True) -> dict[str, Any]:
    """Beam-4 and greedy sentences/s with the cache (and the full-prefix reference when asked)."""
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(4, CONFIG.vocab_size, (NUM_SENTENCES, SOURCE_LENGTH)), jnp.int32)
    params = jax.jit(Transformer(CONFIG).init)(jax.random.key(0), src[:, :2], src[:, :2])["params"]
    results = {
        f"beam {BEAM_SIZE}, key/value cache": measure(beam_decoder(cached_step), params, src, repeats),
        "greedy, key/value cache": measure(greedy_decoder(), params, src, repeats),
    }
    summary: dict[str, Any] = {}
    if with_reference:
        reference = measure(beam_decoder(prefix_step), params, src, 1)
        cached = results[f"beam {BEAM_SIZE}, key/value cache"]
        results[f"beam {BEAM_SIZE}, full forward on the prefix"] = reference
        summary["cache_speedup"] = reference["seconds"] / cached["seconds"]
        summary["same_beams_as_reference"] = bool(np.array_equal(cached["output"][0], reference["output"][0]))
    summary["decoders"] = {name: {k: v for k, v in r.items() if k != "output"} for name, r in results.items()}
    summary["shape"] = {"sentences": NUM_SENTENCES, "source_length": SOURCE_LENGTH,
                        "output_length": SOURCE_LENGTH + EXTRA_LENGTH, "d_model": CONFIG.d_model,
                        "layers": CONFIG.num_layers, "vocab_size": CONFIG.vocab_size}
    return summary
