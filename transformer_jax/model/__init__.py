"""The model: the paper's concepts as Flax linen modules, the part other Flax projects import.

Reading order: `config` (hyperparameters) -> `masks`, `attention` (section 3.2) -> `embeddings`
(section 3.4), `positional_encoding` (section 3.5), `feed_forward` (section 3.3), `dropout` ->
`layers` (residual + LayerNorm, encoder and decoder layers) -> `stacks` (Encoder, Decoder) ->
`transformer` (the encoder-decoder). `flops` counts the model's FLOPs analytically.
`Transformer(config, decoding=True)` decodes one position per call with `mutable=DECODING_COLLECTIONS`.
"""

from transformer_jax.model.attention import (
    DECODING_COLLECTIONS,
    MultiHeadAttention,
    attention_weights,
    scaled_dot_product_attention,
)
from transformer_jax.model.attention_kernels import command_buffer_flags
from transformer_jax.model.config import PRESETS, TransformerConfig
from transformer_jax.model.embeddings import OutputProjection, TokenEmbedding
from transformer_jax.model.feed_forward import FeedForward
from transformer_jax.model.flops import attention_score_flops, model_flops_utilization, train_step_flops
from transformer_jax.model.layers import DecoderLayer, EncoderLayer
from transformer_jax.model.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)
from transformer_jax.model.positional_encoding import (
    PositionalEncoding,
    sinusoidal_encoding,
)
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_jax.model.stacks import (
    Decoder,
    Encoder,
    scanned_layout,
    unscanned_layout,
)
from transformer_jax.model.transformer import Transformer, output_weights

__all__ = [
    "BOS_ID",
    "DECODING_COLLECTIONS",
    "EOS_ID",
    "PAD_ID",
    "PRESETS",
    "UNK_ID",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "OutputProjection",
    "PositionalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "attention_score_flops",
    "attention_weights",
    "causal_mask",
    "command_buffer_flags",
    "combine_masks",
    "model_flops_utilization",
    "output_weights",
    "padding_mask",
    "scaled_dot_product_attention",
    "scanned_layout",
    "segment_mask",
    "sinusoidal_encoding",
    "train_step_flops",
    "unscanned_layout",
]
