"""The encoder-decoder Transformer (paper section 3, figure 1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.stacks import Decoder, Encoder, token_embedding


class Transformer(nn.Module):
    """The encoder-decoder Transformer: `encode(src)`, `decode(encoded, src, tgt_in)`, `__call__(src, tgt_in)`.

    Token id 0 is padding everywhere. `tgt_in` is the target shifted right (starting with BOS).
    Packed rows pass `*_positions` and `*_segments` (segment ids > 0; attention stays within a
    segment).
    """

    config: TransformerConfig
    # True builds the decoder for one-position-per-call decoding with a key/value cache: call
    # `decode` with `mutable=DECODING_COLLECTIONS` (model/attention.py says what each one holds).
    decoding: bool = False

    def setup(self) -> None:
        cfg = self.config
        shared = token_embedding(cfg, "shared_embedding") if cfg.share_embeddings else None
        self.shared_embedding = shared
        self.encoder = Encoder(cfg, shared_embedding=shared)
        self.decoder = Decoder(cfg, shared_embedding=shared, decode=self.decoding)

    def encode(
        self,
        src_tokens: jax.Array,
        src_positions: jax.Array | None = None,
        src_segments: jax.Array | None = None,
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        """[B, S] source ids -> [B, S, d_model] encoder output."""
        return self.encoder(src_tokens, src_positions, src_segments, deterministic=deterministic)

    def decode(
        self,
        encoded_BxSxD: jax.Array,
        src_tokens: jax.Array,
        tgt_in: jax.Array,
        tgt_positions: jax.Array | None = None,
        src_segments: jax.Array | None = None,
        tgt_segments: jax.Array | None = None,
        *,
        deterministic: bool = True,
        hidden_only: bool = False,
    ) -> jax.Array:
        """Encoder output + shifted-right targets -> [B, T, vocab] float32 logits (`hidden_only`: the
        [B, T, d_model] input of the pre-softmax projection; its weights are `output_weights(params)`)."""
        return self.decoder(
            encoded_BxSxD, src_tokens, tgt_in, tgt_positions, src_segments, tgt_segments,
            deterministic=deterministic, hidden_only=hidden_only,
        )

    def __call__(
        self,
        src_tokens: jax.Array,
        tgt_in: jax.Array,
        src_positions: jax.Array | None = None,
        tgt_positions: jax.Array | None = None,
        src_segments: jax.Array | None = None,
        tgt_segments: jax.Array | None = None,
        *,
        deterministic: bool = True,
        hidden_only: bool = False,
    ) -> jax.Array:
        """[B, S] source ids and [B, T] shifted-right target ids -> [B, T, vocab] float32 logits (or, with
        `hidden_only`, the [B, T, d_model] input of the pre-softmax projection, as `decode`)."""
        encoded_BxSxD = self.encode(src_tokens, src_positions, src_segments, deterministic=deterministic)
        return self.decode(
            encoded_BxSxD, src_tokens, tgt_in, tgt_positions, src_segments, tgt_segments,
            deterministic=deterministic, hidden_only=hidden_only,
        )


def output_weights(params: Mapping[str, Any], config: TransformerConfig) -> tuple[jax.Array, jax.Array | None]:
    """The pre-softmax projection of a Transformer's `params` as a [vocab, d_model] table and a bias (or None):
    the shared (or the decoder's) embedding table when tied (paper section 3.4), else the output projection's
    kernel, transposed, and its bias. Logits = hidden @ table^T + bias, as the model computes them."""
    params = nn.unbox(params)
    if config.tie_output_embedding:
        owner = params["shared_embedding"] if config.share_embeddings else params["decoder"]["embedding"]
        return owner["embedding"], params["decoder"]["output_bias"] if config.output_bias else None
    projection = params["decoder"]["output_projection"]
    return projection["kernel"].T, projection["bias"]
