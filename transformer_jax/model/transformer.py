"""The encoder-decoder Transformer (paper section 3, figure 1)."""

from __future__ import annotations

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
    ) -> jax.Array:
        """Encoder output + shifted-right targets -> [B, T, vocab] float32 logits."""
        return self.decoder(
            encoded_BxSxD, src_tokens, tgt_in, tgt_positions, src_segments, tgt_segments,
            deterministic=deterministic,
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
    ) -> jax.Array:
        """[B, S] source ids and [B, T] shifted-right target ids -> [B, T, vocab] float32 logits."""
        encoded_BxSxD = self.encode(src_tokens, src_positions, src_segments, deterministic=deterministic)
        return self.decode(
            encoded_BxSxD, src_tokens, tgt_in, tgt_positions, src_segments, tgt_segments,
            deterministic=deterministic,
        )
