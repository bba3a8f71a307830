"""translate_batch: every decoding mode through one entry point, and the errors of bad arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.step import cached_step
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.sampling import sample_decode
from transformer_jax.decoding.translate import decoding_precision, translate_batch
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


def test_bfloat16_decoding_casts_the_weights_and_keeps_the_translations(model, greedy_output, beam_output,
                                                                        beam_settings):
    params, config, src = model
    # A float32 model on an accelerator is decoded as it is; on a CPU its matmuls return float32 (the same values).
    assert decoding_precision(params, config, "", "tpu")[1] is config
    # On GPUs the self-attention cache is one chunk: no conditional in the search loop.
    assert decoding_precision(params, config, "float32", "gpu")[1] == config.replace(chunked_decoding_cache=False)
    assert decoding_precision(params, config, "", "cpu")[1] == config.replace(float32_dot_outputs=True)
    cast, cast_config = decoding_precision(params, config, "bfloat16", "cpu")
    assert (cast_config.dtype, cast_config.param_dtype) == ("bfloat16", "bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(cast)} == {jnp.dtype(jnp.bfloat16)}
    # On CPUs the caches the steps attend over stay float32: XLA:CPU has no native bfloat16 batched matmul.
    state = jax.eval_shape(lambda p: cached_step(p, cast_config, src, 2, 5)[1], cast)
    assert {leaf.dtype for leaf in jax.tree.leaves(state.shared["slot_cache"])} == {jnp.dtype(jnp.float32)}
    tpu_params, tpu_config = decoding_precision(params, config, "bfloat16", "tpu")
    state = jax.eval_shape(lambda p: cached_step(p, tpu_config, src, 2, 5)[1], tpu_params)
    assert {leaf.dtype for leaf in jax.tree.leaves(state.shared["slot_cache"])} == {jnp.dtype(jnp.bfloat16)}
    greedy = np.asarray(translate_batch(cast, cast_config, src, DecodeOptions(mode="greedy", max_extra_length=6)))
    assert greedy.shape == greedy_output.shape and (greedy == greedy_output).mean() >= 0.9
    tokens, scores = beam_search(cast, cast_config, src, **beam_settings)
    same = (np.asarray(tokens) == beam_output[0]).all(axis=-1)
    assert same.mean() >= 0.75
    # It did run in bfloat16: the scores of the same hypotheses differ, by rounding only.
    assert not np.array_equal(np.asarray(scores)[same], beam_output[1][same])
    np.testing.assert_allclose(np.asarray(scores)[same], beam_output[1][same], atol=0.05)
    with pytest.raises(ConfigError, match="dtype='float16' is not one of"):
        decoding_precision(params, config, "float16", "cpu")


def test_weights_read_in_the_compute_dtype_are_cast_once_with_the_same_translations(model, beam_settings):
    params, config, src = model
    config = config.replace(dtype="bfloat16")  # float32 parameters, bfloat16 matmuls
    cast, cast_config = decoding_precision(params, config, "", "tpu")
    dtypes = {"/".join(str(getattr(k, "key", k)) for k in path): leaf.dtype
              for path, leaf in jax.tree_util.tree_leaves_with_path(cast)}
    assert dtypes["decoder/layer_0/feed_forward/inner/kernel"] == jnp.bfloat16
    assert dtypes["shared_embedding/embedding"] == jnp.bfloat16
    assert dtypes["decoder/positional_encoding/position_embedding"] == jnp.bfloat16
    # Biases and LayerNorm's parameters stay as stored: the output projection's bias is added in float32.
    assert dtypes["decoder/output_projection/bias"] == jnp.float32
    assert dtypes["decoder/layer_0/feed_forward_norm/scale"] == jnp.float32
    for search in (lambda p: beam_search(p, cast_config, src, **beam_settings),
                   lambda p: translate_batch(p, cast_config, src, DecodeOptions(mode="greedy", max_extra_length=6))):
        for got, expected in zip(jax.tree.leaves(search(cast)), jax.tree.leaves(search(params)), strict=True):
            np.testing.assert_array_equal(got, expected)
