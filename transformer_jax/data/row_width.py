"""The width of packed training rows, chosen from the corpus's lengths by what a train step costs.

`data.max_length` is a filter (the longest pair a run accepts); the row width is what a batch is made
of. A packed row of width W costs every attention W^2 scores per head (their matmuls, softmax, masks
and gradients), so rows of max_length=256 filled with 12-token sentences pay about 20x the attention
they use. The width is chosen by pricing one epoch at each candidate width:

  cost(W) = batches(W) x step_cost(rows(W), W) + the long pairs' batches at their own width,
  step_cost = matmul FLOPs (linear layers ∝ tokens, attention scores ∝ rows x W^2)
              + SCORE_COST x score elements (the elementwise work per score: mask, softmax, dropout)
              + STEP_OVERHEAD_PER_PARAMETER x parameters (the optimizer update, the same every step),

where batches(W) comes from first-fit packing a sample of the corpus at that width (so padding waste
is counted) and pairs longer than W go to rows of their own (batching.py).

SCORE_COST is measured, on 2 shared CPU cores, from train steps of one token budget (4,096) at several
widths (d_model 256, N=3, vocab 8,000): rows of 32 vs 256 tokens took 20.2 s vs 37.8 s a step (a
loaded machine, 2 alternating rounds) for 189 vs 215 GFLOP and 4.7M vs 37.7M scores: about 4,800
FLOP-equivalents per score; the same model on a real 12-token corpus ran 22% faster with rows of 96
than of 256 tokens, about 1,000. The elementwise passes over [rows, heads, W, W] (masks, softmax and
their gradients) run far below the matmul rate. 2,000 sits between the two; the choice is flat near
its optimum, and benchmarks/run.py --sections widths checks it against real steps.
"""

from __future__ import annotations

import numpy as np

from transformer_jax.data.batching import first_fit, length_buckets
from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.flops import train_step_flops

# FLOP-equivalents of the elementwise work per attention score (mask, softmax and its gradient); see above.
SCORE_COST = 2000.0
# FLOP-equivalents per parameter of what every step pays whatever its shape (the Adam update).
STEP_OVERHEAD_PER_PARAMETER = 10.0
SMALLEST_WIDTH = 16


def score_elements(model: TransformerConfig, rows: int, width: int) -> int:
    """Attention scores of one batch: encoder self, decoder self and cross attention, every head and layer."""
    return rows * width * width * model.num_heads * model.num_layers * 3


def parameter_count(model: TransformerConfig) -> int:
    """About the number of parameters (shared embeddings, encoder and decoder stacks)."""
    d, d_ff = model.d_model, model.d_ff
    encoder_layer = 4 * d * d + 2 * d * d_ff
    decoder_layer = 8 * d * d + 2 * d * d_ff
    return model.vocab_size * d + model.num_layers * (encoder_layer + decoder_layer)


def step_cost(model: TransformerConfig, rows: int, width: int) -> float:
    """Estimated FLOP-equivalents of one train step on `rows` x `width` packed rows."""
    return (train_step_flops(model, rows, width, width) + SCORE_COST * score_elements(model, rows, width)
            + STEP_OVERHEAD_PER_PARAMETER * parameter_count(model))


def epoch_cost(source_lengths: np.ndarray, target_lengths: np.ndarray, model: TransformerConfig,
               tokens_per_batch: int, width: int, long_width: int, row_multiple: int = 1) -> float:
    """Estimated cost of packing these pairs at `width` (longer pairs at `long_width`), in step FLOPs."""
    longest = np.maximum(source_lengths, target_lengths)
    cost = 0.0
    for fits, group_width in ((longest <= width, width), (longest > width, long_width)):
        if not fits.any():
            continue
        _, num_rows = first_fit(source_lengths[fits].tolist(), target_lengths[fits].tolist(), group_width)
        rows = tokens_per_batch // group_width // row_multiple * row_multiple
        cost += num_rows / rows * step_cost(model, rows, group_width)  # fractional batches: an estimate
    return cost


def candidate_widths(longest: int, tokens_per_batch: int, row_multiple: int) -> list[int]:
    """Widths worth pricing: the bucket lengths up to the longest pair, each holding one row per device."""
    widest = -(-longest // 8) * 8
    return [width for width in length_buckets(widest) if width >= min(SMALLEST_WIDTH, widest)
            and tokens_per_batch // width >= row_multiple]


def choose_row_width(corpus: EncodedPairs, model: TransformerConfig, tokens_per_batch: int, max_length: int,
                     row_multiple: int = 1, sample_size: int = 20_000) -> int:
    """The packed row width with the lowest estimated epoch cost for this corpus and model.

    Deterministic: the sample is drawn with a fixed seed, so every process (and a resume) chooses
    the same width from the same corpus.
    """
    sample = np.random.default_rng(0).permutation(len(corpus))[:sample_size]
    source, target = corpus.source.lengths[sample], corpus.target.lengths[sample]
    longest = min(int(max(corpus.source.lengths.max(), corpus.target.lengths.max())), max_length)
    long_width = min(max_length, -(-longest // 8) * 8)
    candidates = candidate_widths(longest, tokens_per_batch, row_multiple) or [long_width]
    costs = {width: epoch_cost(source, target, model, tokens_per_batch, width, long_width, row_multiple)
             for width in candidates}
    return min(costs, key=costs.get)
