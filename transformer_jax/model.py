"""The encoder and decoder stacks and the encoder-decoder Transformer (paper section 3, figure 1)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config import TransformerConfig
from transformer_jax.embeddings import OutputProjection, PositionalEncoding, TokenEmbedding
from transformer_jax.layers import DecoderLayer, EncoderLayer, layer_norm
from transformer_jax.masks import causal_mask, combine_masks, padding_mask, segment_mask


def token_embedding(config: TransformerConfig, name: str) -> TokenEmbedding:
    """A TokenEmbedding configured from `config`."""
    return TokenEmbedding(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        name=name,
    )


def default_positions(tokens: jax.Array) -> jax.Array:
    """[B, T] positions 0..T-1 for unpacked rows."""
    return jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)


def _segment_mask_or_none(q_segments: jax.Array | None, kv_segments: jax.Array | None) -> jax.Array | None:
    if q_segments is None or kv_segments is None:
        return None
    return segment_mask(q_segments, kv_segments)


class Encoder(nn.Module):
    """Embedding + positions, dropout, N encoder layers (and a final LayerNorm when pre-LN).

    `shared_embedding` lets a parent share one TokenEmbedding with the decoder; without it the
    encoder owns its table.
    """

    config: TransformerConfig
    shared_embedding: TokenEmbedding | None = None

    @nn.compact
    def __call__(
        self,
        src_tokens: jax.Array,
        src_positions: jax.Array | None = None,
        src_segments: jax.Array | None = None,
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        """[B, S] source ids (0 = padding) -> [B, S, d_model] encoder output."""
        cfg = self.config
        embed = self.shared_embedding if self.shared_embedding is not None else token_embedding(cfg, "embedding")
        positions = default_positions(src_tokens) if src_positions is None else src_positions
        x_BxSxD = embed(src_tokens) + PositionalEncoding(
            cfg.d_model, cfg.max_len, cfg.positional_encoding, cfg.compute_dtype,
            cfg.params_dtype, name="positional_encoding",
        )(positions)
        x_BxSxD = nn.Dropout(cfg.dropout_rate)(x_BxSxD, deterministic=deterministic)
        mask = combine_masks(
            padding_mask(src_tokens, src_tokens), _segment_mask_or_none(src_segments, src_segments)
        )
        for i in range(cfg.num_layers):
            x_BxSxD = EncoderLayer(cfg, name=f"layer_{i}")(x_BxSxD, mask, deterministic=deterministic)
        if cfg.norm_position == "pre":
            x_BxSxD = layer_norm(cfg, "final_norm")(x_BxSxD)
        return x_BxSxD


class Decoder(nn.Module):
    """Embedding + positions, dropout, N decoder layers, (final LayerNorm,) pre-softmax projection.

    With `decode=True` it runs one target position per call against a 'cache' collection; the
    call that creates the cache (given the whole, possibly dummy, target) fixes its length.
    """

    config: TransformerConfig
    shared_embedding: TokenEmbedding | None = None
    decode: bool = False

    @nn.compact
    def __call__(
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
        """[B, T] shifted-right target ids -> [B, T, vocab] float32 logits."""
        cfg = self.config
        embed = self.shared_embedding if self.shared_embedding is not None else token_embedding(cfg, "embedding")
        stepping = self.decode and self.has_variable("cache", "position")
        if self.decode:
            position = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
            if stepping and tgt_positions is None:
                tgt_positions = jnp.broadcast_to(position.value, tgt_in.shape)
            if stepping:
                position.value = position.value + tgt_in.shape[1]
        positions = default_positions(tgt_in) if tgt_positions is None else tgt_positions
        y_BxTxD = embed(tgt_in) + PositionalEncoding(
            cfg.d_model, cfg.max_len, cfg.positional_encoding, cfg.compute_dtype,
            cfg.params_dtype, name="positional_encoding",
        )(positions)
        y_BxTxD = nn.Dropout(cfg.dropout_rate)(y_BxTxD, deterministic=deterministic)

        # While stepping, the self-attention cache itself hides positions not yet written.
        self_mask = None if stepping else combine_masks(
            padding_mask(tgt_in, tgt_in),
            causal_mask(tgt_in.shape[1]),
            _segment_mask_or_none(tgt_segments, tgt_segments),
        )
        cross_mask = combine_masks(
            padding_mask(tgt_in, src_tokens), _segment_mask_or_none(tgt_segments, src_segments)
        )
        for i in range(cfg.num_layers):
            y_BxTxD = DecoderLayer(cfg, decode=self.decode, name=f"layer_{i}")(
                y_BxTxD, encoded_BxSxD, self_mask, cross_mask, deterministic=deterministic
            )
        if cfg.norm_position == "pre":
            y_BxTxD = layer_norm(cfg, "final_norm")(y_BxTxD)
        if cfg.tie_output_embedding:
            return embed.attend(y_BxTxD)
        return OutputProjection(
            cfg.vocab_size, cfg.compute_dtype, cfg.params_dtype, name="output_projection"
        )(y_BxTxD)


class Transformer(nn.Module):
    """The encoder-decoder Transformer: `encode(src)`, `decode(encoded, src, tgt_in)`, `__call__(src, tgt_in)`.

    Token id 0 is padding everywhere. `tgt_in` is the target shifted right (starting with BOS).
    Packed rows pass `*_positions` and `*_segments` (segment ids > 0; attention stays within a
    segment).
    """

    config: TransformerConfig
    # True builds the decoder for one-position-per-call decoding with a key/value cache.
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
