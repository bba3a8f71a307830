"""Shared fixtures of the decoding tests: a small Transformer and its beam and greedy outputs."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID
from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.sampling import greedy_decode
from transformer_jax.model.masks import PAD_ID


@pytest.fixture(scope="session")
def model() -> tuple[dict, TransformerConfig, jax.Array]:
    """Random weights scaled so that outputs vary along the sentence and end at different lengths."""
    config = TransformerConfig.preset(
        "tiny", vocab_size=50, max_len=32, norm_position="pre", positional_encoding="learned",
        tie_output_embedding=False)
    src = jnp.array([[5, 6, 7, 8, 9, 10, 3], [11, 12, 13, 3, 0, 0, 0],
                     [14, 15, 21, 3, 0, 0, 0], [16, 17, 18, 19, 20, 3, 0]], jnp.int32)
    params = nn.meta.unbox(jax.jit(Transformer(config).init)(jax.random.key(0), src, src[:, :3])["params"])
    params = jax.tree.map(lambda x: 1.5 * x, params)
    params["decoder"]["positional_encoding"]["position_embedding"] *= 10.0
    bias = params["decoder"]["output_projection"]["bias"]
    params["decoder"]["output_projection"]["bias"] = bias.at[EOS_ID].set(2.0)
    return params, config, src


@pytest.fixture(scope="session")
def beam_settings() -> dict:
    """The beam search the Transformer tests run: 3 beams, all 3 returned, at most 6 extra tokens."""
    return dict(beam_size=3, alpha=0.6, max_extra_length=6, num_returned=3)


@pytest.fixture(scope="session")
def beam_output(model, beam_settings) -> tuple[np.ndarray, np.ndarray]:
    """([B, 3, L] tokens, [B, 3] scores) of the cached beam search with `beam_settings`."""
    tokens, scores = beam_search(*model, **beam_settings)
    return np.asarray(tokens), np.asarray(scores)


@pytest.fixture(scope="session")
def greedy_output(model) -> np.ndarray:
    """[B, L] cached greedy outputs with at most 6 extra tokens."""
    return np.asarray(greedy_decode(*model, max_extra_length=6))


@pytest.fixture(scope="session")
def full_forward_log_probs() -> Callable[..., jax.Array]:
    """(params, config, src, tgt_in) -> [B, T, V] full forward pass log-probs (PAD, BOS never emitted)."""

    def log_probs(params: dict, config: TransformerConfig, src: jax.Array, tgt_in: jax.Array) -> jax.Array:
        logits = jax.jit(Transformer(config).apply)({"params": params}, src, tgt_in)
        allowed = np.ones(logits.shape[-1], bool)
        allowed[[PAD_ID, BOS_ID]] = False
        return jax.nn.log_softmax(jnp.where(allowed, logits, -jnp.inf), axis=-1)

    return log_probs
