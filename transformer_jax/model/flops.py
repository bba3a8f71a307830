"""Analytic FLOP counts of the Transformer, for model FLOPs utilization (MFU).

Counts the matrix multiplications only (2 FLOPs per multiply-add), on the shapes actually computed:
padded rows count in full, attention scores are counted for every (query, key) pair including masked
ones (the causal triangle and other segments of packed rows are computed and then masked). Softmax,
LayerNorm, dropout, embeddings lookups and the optimizer are not counted: they are a few percent of
the work and do not run on the matrix units. The backward pass is counted as twice the forward.
"""

from __future__ import annotations

from transformer_jax.model.config import TransformerConfig


def encoder_flops_per_token(config: TransformerConfig, source_length: int) -> int:
    """Forward FLOPs of the encoder stack per source token (rows of `source_length`)."""
    d, d_ff = config.d_model, config.d_ff
    projections = 2 * 4 * d * d  # Q, K, V and output projections
    attention = 2 * 2 * source_length * d  # QK^T and weights x V over all heads
    feed_forward = 2 * 2 * d * d_ff
    return config.num_layers * (projections + attention + feed_forward)


def decoder_flops_per_token(config: TransformerConfig, source_length: int, target_length: int) -> int:
    """Forward FLOPs of the decoder stack and the output projection per target token.

    The encoder-decoder keys/values are projected from source tokens; see `cross_kv_flops_per_source_token`.
    """
    d, d_ff = config.d_model, config.d_ff
    self_attention = 2 * 4 * d * d + 2 * 2 * target_length * d
    cross_attention = 2 * 2 * d * d + 2 * 2 * source_length * d  # Q and output projections, scores
    feed_forward = 2 * 2 * d * d_ff
    output_projection = 2 * d * config.vocab_size
    return config.num_layers * (self_attention + cross_attention + feed_forward) + output_projection


def cross_kv_flops_per_source_token(config: TransformerConfig) -> int:
    """Forward FLOPs of projecting one source position to the decoder's cross-attention keys/values."""
    return config.num_layers * 2 * 2 * config.d_model * config.d_model


def forward_flops(config: TransformerConfig, rows: int, source_length: int, target_length: int) -> int:
    """Forward FLOPs of one batch of `rows` x (`source_length`, `target_length`) token rows."""
    source_tokens, target_tokens = rows * source_length, rows * target_length
    return (
        source_tokens * (encoder_flops_per_token(config, source_length) + cross_kv_flops_per_source_token(config))
        + target_tokens * decoder_flops_per_token(config, source_length, target_length)
    )


def train_step_flops(config: TransformerConfig, rows: int, source_length: int, target_length: int) -> int:
    """Forward + backward FLOPs of one training step (backward = 2 x forward)."""
    return 3 * forward_flops(config, rows, source_length, target_length)


def attention_score_flops(config: TransformerConfig, rows: int, source_length: int, target_length: int) -> int:
    """The part of `train_step_flops` in QK^T and weights x V (encoder self, decoder self and cross attention):
    what an attention kernel computes (XLA's cost analysis does not see inside one)."""
    per_layer = (rows * source_length * 2 * 2 * source_length * config.d_model
                 + rows * target_length * 2 * 2 * (target_length + source_length) * config.d_model)
    return 3 * config.num_layers * per_layer


def model_flops_utilization(flops_per_step: float, seconds_per_step: float, peak_flops_per_second: float) -> float:
    """Achieved FLOP rate over the device's (measured) peak matmul rate."""
    return flops_per_step / seconds_per_step / peak_flops_per_second


def parameter_count(config: TransformerConfig) -> int:
    """About the number of parameters (shared embeddings, encoder and decoder stacks; biases and LayerNorms left
    out): a closed form, known before anything is built."""
    d, d_ff = config.d_model, config.d_ff
    encoder_layer = 4 * d * d + 2 * d * d_ff
    decoder_layer = 8 * d * d + 2 * d * d_ff
    return config.vocab_size * d + config.num_layers * (encoder_layer + decoder_layer)
