"""translate_batch: every decoding mode through one entry point, and the errors of bad arguments."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.sampling import sample_decode
from transformer_jax.decoding.translate import translate_batch
from transformer_jax.errors import ConfigError


def test_translate_batch_modes_and_argument_errors(model, beam_output, greedy_output, beam_settings):
    params, config, src = model
    best = translate_batch(params, config, src, DecodeOptions(
        beam_size=beam_settings["beam_size"], alpha=beam_settings["alpha"],
        max_extra_length=beam_settings["max_extra_length"]))
    np.testing.assert_array_equal(best, beam_output[0][:, 0])
    np.testing.assert_array_equal(
        translate_batch(params, config, src, DecodeOptions(mode="greedy", max_extra_length=6)), greedy_output)
    sampled = translate_batch(params, config, src, DecodeOptions(mode="sample", top_p=1e-6, max_extra_length=6))
    np.testing.assert_array_equal(sampled, greedy_output)  # a tiny nucleus is the argmax
    with pytest.raises(ConfigError, match="mode"):
        DecodeOptions(mode="nucleus")
    with pytest.raises(ValueError, match="num_returned"):
        beam_search(params, config, src, beam_size=2, num_returned=3)
    with pytest.raises(ValueError, match="temperature"):
        sample_decode(params, config, src, jax.random.key(0), temperature=0.0)
