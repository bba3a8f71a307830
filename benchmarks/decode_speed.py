"""Beam-search speed with the key/value cache against a decoder that reruns the whole prefix.

    python benchmarks/decode_speed.py [--json results.json]

Both decoders run the same beam search (`beam_search_loop`, beam 4, alpha 0.6) on the same randomly
initialized model (d_model 256, 3 layers, d_ff 1024, 4 heads, vocabulary 8000) and the same 32
source sentences of 25 tokens; EOS is disabled so that every output is 50 tokens long (25 + 25). The
reference step runs `Transformer.__call__` on the whole prefix padded to 50 every step; the cached
step feeds one position and reuses the encoder output and its keys/values. Compilation is timed
apart. It takes 70-100 s on 2 CPU cores; the cached beam search must be at least 5x faster (exit
status 1 otherwise, or if the two decoders disagree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.decode import (
    beam_search_loop,
    cached_step,
    greedy_choice,
    max_output_lengths,
    prefix_step,
    token_loop,
)

CONFIG = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=128)
NUM_SENTENCES, SOURCE_LENGTH, EXTRA_LENGTH = 32, 25, 25
BEAM_SIZE, ALPHA = 4, 0.6
NO_EOS = -1  # no token has this id, so every hypothesis runs to its maximum length
REQUIRED_SPEEDUP = 5.0


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the cached decoders")
    parser.add_argument("--reference-repeats", type=int, default=1, help="timed runs of the reference")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(4, CONFIG.vocab_size, (NUM_SENTENCES, SOURCE_LENGTH)), jnp.int32)
    params = jax.jit(Transformer(CONFIG).init)(jax.random.key(0), src[:, :2], src[:, :2])["params"]
    results = {
        f"beam {BEAM_SIZE}, key/value cache": measure(beam_decoder(cached_step), params, src, args.repeats),
        f"beam {BEAM_SIZE}, full forward on the prefix": measure(
            beam_decoder(prefix_step), params, src, args.reference_repeats),
        "greedy, key/value cache": measure(greedy_decoder(), params, src, args.repeats),
    }
    cached, reference, _ = results.values()
    speedup = reference["seconds"] / cached["seconds"]
    same_tokens = bool(np.array_equal(cached["output"][0], reference["output"][0]))
    output_tokens = int(np.count_nonzero(np.asarray(cached["output"][0])[:, 0], axis=-1).mean())

    print(f"{NUM_SENTENCES} sentences x {SOURCE_LENGTH} tokens -> {output_tokens} output tokens each; "
          f"d_model {CONFIG.d_model}, {CONFIG.num_layers} layers, vocabulary {CONFIG.vocab_size}; "
          f"jax {jax.__version__} on {jax.devices()[0].platform}")
    print(f"{'decoder':<40} {'seconds':>9} {'sentences/s':>12} {'compile s':>10}")
    for name, result in results.items():
        print(f"{name:<40} {result['seconds']:>9.2f} {result['sentences_per_s']:>12.2f} "
              f"{result['compile_s']:>10.1f}")
    print(f"cache speed-up for beam search: {speedup:.1f}x (required >= {REQUIRED_SPEEDUP:.0f}x); "
          f"same beams as the reference: {'yes' if same_tokens else 'NO'}")

    if args.json:
        summary = {name: {k: v for k, v in r.items() if k != "output"} for name, r in results.items()}
        summary.update(speedup=speedup, same_tokens=same_tokens, output_tokens=output_tokens,
                       num_sentences=NUM_SENTENCES, source_length=SOURCE_LENGTH, beam_size=BEAM_SIZE,
                       jax_version=jax.__version__, platform=jax.devices()[0].platform)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if speedup >= REQUIRED_SPEEDUP and same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
