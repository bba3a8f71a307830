"""transformer_jax: the Transformer of "Attention Is All You Need" as reusable Flax modules."""

from transformer_jax.attention import (
    MultiHeadAttention,
    attention_weights,
    scaled_dot_product_attention,
)
from transformer_jax.config import PRESETS, ConfigError, TransformerConfig
from transformer_jax.decode import beam_search, greedy_decode, sample_decode, translate_batch
from transformer_jax.embeddings import PositionalEncoding, TokenEmbedding, sinusoidal_encoding
from transformer_jax.feed_forward import FeedForward
from transformer_jax.layers import DecoderLayer, EncoderLayer
from transformer_jax.masks import (
    PAD_ID,
    causal_mask,
    combine_masks,
    key_padding_mask,
    padding_mask,
    segment_mask,
)
from transformer_jax.model import Decoder, Encoder, Transformer

__all__ = [
    "PAD_ID",
    "PRESETS",
    "ConfigError",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "attention_weights",
    "beam_search",
    "greedy_decode",
    "sample_decode",
    "translate_batch",
    "causal_mask",
    "combine_masks",
    "key_padding_mask",
    "padding_mask",
    "scaled_dot_product_attention",
    "segment_mask",
    "sinusoidal_encoding",
]
__version__ = "0.1.0"
