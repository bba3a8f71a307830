"""Decoding: turning source ids into output ids with a trained Transformer.

`options` (DecodeOptions: mode, beam, length penalty, limits, sampling) -> `lengths` (output length
limits, length penalty) -> `cache` (the cached one-position step and the full-prefix reference) ->
`sampling` (greedy and sampled decoding) and `beam_search` -> `translate` (one entry point for every
mode, and `in_dtype`: weights and config for decoding in bfloat16 or float32).
"""

from transformer_jax.decoding.beam_search import (
    BeamSearchOutput,
    beam_search,
    beam_search_loop,
)
from transformer_jax.decoding.cache import StepState, cached_step, decoding_platform, prefix_step
from transformer_jax.decoding.lengths import length_penalty, max_output_lengths
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.sampling import (
    filter_logits,
    greedy_decode,
    sample_decode,
    token_loop,
)
from transformer_jax.decoding.translate import in_dtype, translate_batch

__all__ = [
    "BeamSearchOutput", "DecodeOptions", "StepState", "beam_search", "beam_search_loop", "cached_step",
    "decoding_platform", "filter_logits", "greedy_decode", "in_dtype", "length_penalty", "max_output_lengths",
    "prefix_step", "sample_decode", "token_loop", "translate_batch",
]
