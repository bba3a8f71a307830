"""Output length limits and the length penalty: the formulas, and the outputs that respect them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformer_jax.model.special_tokens import EOS_ID
from transformer_jax.decoding.lengths import length_penalty, max_output_lengths
from transformer_jax.decoding.sampling import greedy_decode
from transformer_jax.model.masks import PAD_ID


def test_length_penalty_formula():
    np.testing.assert_allclose(length_penalty(jnp.array([1, 6, 19]), 0.6), [1.0, (11 / 6) ** 0.6, 4**0.6])
    np.testing.assert_allclose(length_penalty(jnp.array(10), 0.0), 1.0)


def test_max_output_lengths_count_non_pad_source_tokens_and_cap_at_max_len():
    src = jnp.array([[5, 6, 7, 3], [5, 3, 0, 0], [0, 0, 0, 0]])
    assert max_output_lengths(src, 50, 512).tolist() == [54, 52, 50]
    assert max_output_lengths(src, 50, 53).tolist() == [53, 52, 50]
    # A limit beyond int32 (a direct caller's; DecodeOptions refuses it) allows max_len, no overflow.
    assert max_output_lengths(src, 2**31, 53).tolist() == [53, 53, 53]


def test_outputs_end_at_eos_or_at_the_sentence_maximum(model, beam_output, greedy_output):
    limits = np.asarray(max_output_lengths(model[2], 6, model[1].max_len))
    for tokens in (greedy_output, *beam_output[0].transpose(1, 0, 2)):
        for sentence, limit in zip(tokens, limits):
            ends = np.flatnonzero(sentence == EOS_ID)
            length = ends[0] + 1 if ends.size else limit
            assert np.all(sentence[:length] != PAD_ID) and np.all(sentence[length:] == PAD_ID)
            assert length <= limit
    assert np.any(beam_output[0] == EOS_ID) and not np.all(np.any(beam_output[0] == EOS_ID, axis=-1))


def test_maximum_length_is_the_source_length_plus_extra_capped_by_max_len(model):
    params, config, src = model
    tokens = np.asarray(greedy_decode(params, config, src, max_extra_length=27, eos_id=-1))
    assert tokens.shape == (4, 32)
    # Non-pad sources of 7, 4, 4, 6 tokens: 7 + 27 and 6 + 27 exceed max_len = 32.
    assert np.count_nonzero(tokens, axis=-1).tolist() == [32, 31, 31, 32]
