"""Packed training rows sized to the corpus: the width chosen by what a train step costs, the rows by real tokens.

`data.max_length` is a filter (the longest pair a run accepts); the row width is what a batch is made
of. A packed row of width W costs every attention W^2 scores per head (their matmuls, softmax, masks
and gradients), so rows of max_length=256 filled with 12-token sentences pay about 20x the attention
they use.

Rows per batch: narrower rows pack less tightly (on the demo's corpus 88% of the slots of 32-token rows
hold real tokens, 94% of those of 64-token rows), so a batch of tokens_per_batch slots at the narrow
width teaches less per step than one of rows of max_length (the demo lost 4.5 BLEU at 600 steps). With
the automatic width, `data.tokens_per_batch` therefore counts the slots of rows of max_length, and the
batches at the chosen widths are sized to hold, on average over an epoch, the real tokens those would
(tokens_per_batch x the fill of rows of max_length), from the fill of first-fit packing a sample of the
corpus at each width: about the same number of steps per epoch and real tokens per step at any width.
A batch then has more slots than tokens_per_batch, but never more estimated activation memory than a
batch of rows of max_length (`activation_elements_per_row`). The longest pairs' rows, which pack worst
and are the widest, may be capped by it below the average; the narrow batches then hold that much more
(as far as their own memory allows). Rows are a fixed multiple of `row_multiple` per width (static
shapes) and the sample is drawn with a fixed seed, so every process and a resume size them alike.
An explicit `data.row_width` keeps rows of tokens_per_batch slots (batching.py): a shape the user
states (to fit memory or resume a checkpoint made with it) stays exactly what it says.

The width is chosen by pricing one epoch at each candidate width, with the rows sized as above (so
every width is priced at equal real tokens per step, about the same number of steps per epoch):

  cost(W) = batches(W) x step_cost(rows(W), W) + the long pairs' batches at their own width,
  step_cost = matmul FLOPs (linear layers ∝ tokens, attention scores ∝ rows x W^2)
              + SCORE_COST x score elements (the elementwise work per score: mask, softmax, dropout)
              + STEP_OVERHEAD_PER_PARAMETER x parameters (the optimizer update, the same every step),

where batches(W) = real tokens / (fill(W) x rows(W) x W), fill(W) from first-fit packing at that width
(so padding waste is counted), and pairs longer than W go to rows of their own (batching.py).

SCORE_COST is measured, on 2 shared CPU cores, from train steps of one token budget (4,096) at several
widths (d_model 256, N=3, vocab 8,000): rows of 32 vs 256 tokens took 20.2 s vs 37.8 s a step (a
loaded machine, 2 alternating rounds) for 189 vs 215 GFLOP and 4.7M vs 37.7M scores: about 4,800
FLOP-equivalents per score; the same model on a real 12-token corpus ran 22% faster with rows of 96
than of 256 tokens, about 1,000. The elementwise passes over [rows, heads, W, W] (masks, softmax and
their gradients) run far below the matmul rate. 2,000 sits between the two; the choice is flat near
its optimum, and python -m benchmarks.run --sections widths checks it against real steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from transformer_jax.data.epoch_plan import first_fit
from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.data.shapes import WIDTH_MULTIPLE, length_buckets, round_width
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.flops import parameter_count, train_step_flops

# FLOP-equivalents of the elementwise work per attention score (mask, softmax and its gradient); see above.
SCORE_COST = 2000.0
# FLOP-equivalents per parameter of what every step pays whatever its shape (the Adam update).
STEP_OVERHEAD_PER_PARAMETER = 10.0
SMALLEST_WIDTH = 16


def score_elements(model: TransformerConfig, rows: int, width: int) -> int:
    """Attention scores of one batch: encoder self, decoder self and cross attention, every head and layer."""
    return rows * width * width * model.num_heads * model.num_layers * 3


def step_cost(model: TransformerConfig, rows: int, width: int) -> float:
    """Estimated FLOP-equivalents of one train step on `rows` x `width` packed rows."""
    return (train_step_flops(model, rows, width, width) + SCORE_COST * score_elements(model, rows, width)
            + STEP_OVERHEAD_PER_PARAMETER * parameter_count(model))


def activation_elements_per_row(model: TransformerConfig, width: int) -> int:
    """About the activations one packed row of `width` keeps for the backward pass, in elements.

    Per token: an encoder layer keeps ~8 d_model + 2 d_ff values (projections, residuals, the ReLU's
    input and output), a decoder layer ~12 d_model + 2 d_ff, the loss exp(logits) (vocab_size per target
    token); per attention score, the scores and the probabilities. Only ratios are used: a bound, not
    a prediction of bytes.
    """
    per_token = model.num_layers * (20 * model.d_model + 4 * model.d_ff) + model.vocab_size
    return width * per_token + 2 * score_elements(model, 1, width)


def packing_fill(source_lengths: np.ndarray, target_lengths: np.ndarray, width: int) -> float:
    """Real tokens / slots (both sides) of these pairs packed first-fit, in this order, into rows of `width`."""
    if len(source_lengths) == 0:
        return 1.0
    _, num_rows = first_fit(source_lengths.tolist(), target_lengths.tolist(), width)
    return float((source_lengths.sum() + target_lengths.sum()) / (2 * num_rows * width))


def reference_real_tokens(tokens_per_batch: int, max_length: int, reference_fill: float,
                          row_multiple: int = 1) -> float:
    """Real tokens per side of a batch of rows of max_length (`reference_fill` of its slots): what batches hold."""
    return reference_fill * (tokens_per_batch // max_length // row_multiple * row_multiple) * max_length


def rows_for_real_tokens(model: TransformerConfig, tokens_per_batch: int, max_length: int, width: int, fill: float,
                         real_tokens: float, row_multiple: int = 1) -> int:
    """Rows of `width` (a multiple of row_multiple) holding `real_tokens` a side when `fill` of their slots are real.

    Rounded to the nearest multiple, at most the rows whose activations fit in those of the batch of
    rows of max_length (so a batch never needs more memory than those), at least one multiple.
    """
    reference_rows = tokens_per_batch // max_length // row_multiple * row_multiple
    # Exactly reference_rows at width == max_length (the ratio is then 1.0).
    most = reference_rows * (activation_elements_per_row(model, max_length) / activation_elements_per_row(model, width))
    most_rows = int(most) // row_multiple * row_multiple
    wanted = real_tokens / (fill * width)
    rows = most_rows if wanted >= most_rows else round(wanted / row_multiple) * row_multiple
    return max(row_multiple, min(rows, most_rows))


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Packed training batches: the row width, the longer pairs' width (None: none is longer), and per width
    the global rows of a batch and the share of their slots real tokens fill (measured on a sample).

    `reference_fill` is that share in rows of max_length; rows are sized so that the epoch's batches hold on
    average the real tokens of a batch of rows of max_length (`reference_real_tokens`).
    """

    width: int
    long_width: int | None
    rows: dict[int, int]
    fills: dict[int, float]
    reference_fill: float

    def real_tokens(self, width: int) -> float:
        """Expected real tokens per side of a batch of `width`."""
        return self.fills[width] * self.rows[width] * width


def packed_rows(source_lengths: np.ndarray, target_lengths: np.ndarray, model: TransformerConfig,
                tokens_per_batch: int, max_length: int, width: int, row_multiple: int = 1,
                sample_size: int = 20_000, reference_fill: float | None = None,
                multiple: int = WIDTH_MULTIPLE) -> PackedRows:
    """Rows of `width`, the longer pairs in rows as wide as the longest (to a multiple of 8, at most
    max_length), each width's rows holding the real tokens of rows of max_length (within their memory).

    The pairs must be in a random order: each fill is measured on the first `sample_size` pairs of its
    width (so the few long pairs are sampled from the whole corpus, not from a sample that may hold none).
    """
    longest = np.maximum(source_lengths, target_lengths)
    if reference_fill is None:
        reference_fill = packing_fill(source_lengths[:sample_size], target_lengths[:sample_size], max_length)
    target = reference_real_tokens(tokens_per_batch, max_length, reference_fill, row_multiple)
    widest = round_width(longest.max(), max_length, multiple)
    long_width = widest if longest.max() > width else None
    groups = {width: longest <= width} | ({long_width: longest > width} if long_width else {})
    fills = {}
    for group_width, members in groups.items():
        sample = np.flatnonzero(members)[:sample_size]
        fills[group_width] = packing_fill(source_lengths[sample], target_lengths[sample], group_width)
    rows, short_target = {}, target
    if long_width:
        rows[long_width] = rows_for_real_tokens(model, tokens_per_batch, max_length, long_width, fills[long_width],
                                                target, row_multiple)
        # Memory may cap the long pairs' batches below `target` real tokens: the other batches make up for
        # it (as far as their memory allows), so that the epoch's batches hold `target` on average.
        real = {w: float(source_lengths[m].sum() + target_lengths[m].sum()) / 2 for w, m in groups.items()}
        long_batches = real[long_width] / (fills[long_width] * rows[long_width] * long_width)
        short_batches = (real[width] + real[long_width]) / target - long_batches
        short_target = real[width] / short_batches if short_batches > 0 else float("inf")
    rows[width] = rows_for_real_tokens(model, tokens_per_batch, max_length, width, fills[width], short_target,
                                       row_multiple)
    return PackedRows(width, long_width, dict(sorted(rows.items())), fills, reference_fill)


def epoch_cost(source_lengths: np.ndarray, target_lengths: np.ndarray, model: TransformerConfig,
               layout: PackedRows) -> float:
    """Estimated cost of one epoch of these pairs in `layout`'s batches, in step FLOP-equivalents."""
    longest = np.maximum(source_lengths, target_lengths)
    cost = 0.0
    for width, members in ((layout.width, longest <= layout.width), (layout.long_width, longest > layout.width)):
        if width is None or not members.any():
            continue
        real = float(source_lengths[members].sum() + target_lengths[members].sum()) / 2
        batches = real / layout.real_tokens(width)  # fractional batches: an estimate
        cost += batches * step_cost(model, layout.rows[width], width)
    return cost


def candidate_widths(longest: int, max_length: int, tokens_per_batch: int, row_multiple: int,
                     multiple: int = WIDTH_MULTIPLE) -> list[int]:
    """Widths worth pricing, each holding one row per device: the bucket lengths up to the longest pair (at
    most max_length), or on an accelerator the multiples of its tile (`multiple`, shapes.width_multiple)."""
    widest = round_width(longest, max_length, multiple)
    if multiple > WIDTH_MULTIPLE:
        widths = sorted({min(width, max_length) for width in range(multiple, widest + multiple, multiple)})
    else:
        widths = [width for width in length_buckets(widest) if width >= min(SMALLEST_WIDTH, widest)]
    return [width for width in widths if tokens_per_batch // width >= row_multiple]


def choose_packed_rows(corpus: EncodedPairs, model: TransformerConfig, tokens_per_batch: int, max_length: int,
                       row_multiple: int = 1, sample_size: int = 20_000,
                       multiple: int = WIDTH_MULTIPLE) -> PackedRows:
    """The packed rows with the lowest estimated epoch cost for this corpus and model, sized by real tokens.

    Widths are multiples of `multiple` (8; the chip's tile on TPU/GPU, shapes.width_multiple).
    Deterministic: the order the fills are sampled in is drawn with a fixed seed, so every process (and
    a resume) chooses the same widths and rows from the same corpus.
    """
    order = np.random.default_rng(0).permutation(len(corpus))
    source, target = corpus.source.lengths[order].astype(np.int64), corpus.target.lengths[order].astype(np.int64)
    longest = np.maximum(source, target)
    reference_fill = packing_fill(source[:sample_size], target[:sample_size], max_length)
    # A width no pair fits in would only add an unused shape.
    candidates = [width for width in candidate_widths(int(longest.max()), max_length, tokens_per_batch, row_multiple,
                                                      multiple)
                  if width >= longest.min()] or [round_width(longest.max(), max_length, multiple)]
    layouts = {width: packed_rows(source, target, model, tokens_per_batch, max_length, width, row_multiple,
                                  sample_size, reference_fill, multiple) for width in candidates}
    costs = {width: epoch_cost(source, target, model, layout) for width, layout in layouts.items()}
    return layouts[min(costs, key=costs.get)]
