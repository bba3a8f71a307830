"""Encoder and decoder layers (paper section 3.1), each sublayer wrapped in residual + LayerNorm."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax

from transformer_jax.model.attention import MultiHeadAttention
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.feed_forward import FeedForward


def layer_norm(config: TransformerConfig, name: str) -> nn.LayerNorm:
    """A LayerNorm over d_model (statistics in float32 whatever the compute dtype)."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_epsilon,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        name=name,
    )


def residual(
    config: TransformerConfig,
    x: jax.Array,
    sublayer: Callable[[jax.Array], jax.Array],
    norm_name: str,
    deterministic: bool,
) -> jax.Array:
    """Post-LN: LayerNorm(x + Dropout(Sublayer(x))) (the paper); pre-LN: x + Dropout(Sublayer(LayerNorm(x)))."""
    dropout = Dropout(config.dropout_rate)
    if config.norm_position == "pre":
        return x + dropout(sublayer(layer_norm(config, norm_name)(x)), deterministic=deterministic)
    return layer_norm(config, norm_name)(x + dropout(sublayer(x), deterministic=deterministic))


def multi_head_attention(config: TransformerConfig, name: str, decode: bool = False) -> MultiHeadAttention:
    """A MultiHeadAttention configured from `config`."""
    return MultiHeadAttention(
        num_heads=config.num_heads,
        d_model=config.d_model,
        attention_dropout_rate=config.attention_dropout_rate,
        backend=config.attention_backend,
        decode=decode,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        float32_dot_outputs=config.float32_dot_outputs,
        chunked_cache=config.chunked_decoding_cache,
        name=name,
    )


def feed_forward(config: TransformerConfig) -> FeedForward:
    """A FeedForward configured from `config`."""
    return FeedForward(
        d_model=config.d_model,
        d_ff=config.d_ff,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        float32_dot_outputs=config.float32_dot_outputs,
        activation=config.activation,
        name="feed_forward",
    )


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each with residual + LayerNorm."""

    config: TransformerConfig

    @nn.compact
    def __call__(
        self, x_BxSxD: jax.Array, mask: jax.Array | None, deterministic: bool = True
    ) -> jax.Array:
        """[B, S, d_model] -> [B, S, d_model]; `mask` is the [B, 1, S, S] self-attention mask."""
        cfg = self.config
        attention = multi_head_attention(cfg, "self_attention")
        x_BxSxD = residual(
            cfg, x_BxSxD, lambda y: attention(y, mask=mask, deterministic=deterministic),
            "self_attention_norm", deterministic,
        )
        return residual(cfg, x_BxSxD, feed_forward(cfg), "feed_forward_norm", deterministic)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then feed-forward, each with residual + LayerNorm."""

    config: TransformerConfig
    decode: bool = False

    @nn.compact
    def __call__(
        self,
        y_BxTxD: jax.Array,
        encoded_BxSxD: jax.Array,
        self_mask: jax.Array | None,
        cross_mask: jax.Array | None,
        deterministic: bool = True,
        beam_slots: jax.Array | None = None,
    ) -> jax.Array:
        """[B, T, d_model] targets attending to [B, S, d_model] encoder output -> [B, T, d_model].

        `beam_slots` is the decoding self-attention's table of beam slots (see MultiHeadAttention).
        """
        cfg = self.config
        self_attention = multi_head_attention(cfg, "self_attention", self.decode)
        cross_attention = multi_head_attention(cfg, "cross_attention", self.decode)
        y_BxTxD = residual(
            cfg, y_BxTxD, lambda y: self_attention(y, mask=self_mask, beam_slots=beam_slots, deterministic=deterministic),
            "self_attention_norm", deterministic,
        )
        y_BxTxD = residual(
            cfg,
            y_BxTxD,
            lambda y: cross_attention(y, encoded_BxSxD, mask=cross_mask, deterministic=deterministic),
            "cross_attention_norm",
            deterministic,
        )
        return residual(cfg, y_BxTxD, feed_forward(cfg), "feed_forward_norm", deterministic)
