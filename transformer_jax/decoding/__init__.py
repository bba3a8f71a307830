"""Decoding: turning source ids into output ids with a trained Transformer.

`options` (DecodeOptions: what a search looks for: mode, beam, length penalty, limits, sampling) ->
`lengths` (output length limits, length penalty) -> `step` (the one-position step against the
key/value cache of model/attention_cache.py, and the full-prefix reference) -> `sampling` (greedy
and sampled decoding) and `beam_search` -> `translate` (one entry point for every mode, the
precision a search runs in, the search split over a mesh).
"""

from transformer_jax.decoding.beam_search import BeamSearchOutput, beam_search
from transformer_jax.decoding.lengths import output_width
from transformer_jax.decoding.step import StepState, cached_step, prefix_step
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.sampling import greedy_decode, sample_decode
from transformer_jax.decoding.translate import DTYPES, decoding_precision, translate_batch, translate_rows

__all__ = [
    "DTYPES", "BeamSearchOutput", "DecodeOptions", "StepState", "beam_search", "cached_step", "decoding_precision",
    "greedy_decode", "output_width", "prefix_step", "sample_decode", "translate_batch", "translate_rows",
]
