"""Batches of source sentences to translate: sorted by source length, a few padded widths, rows by token budget.

A split is translated in batches whose shapes come from a small set (each shape is one compiled search):
sentences are sorted by source length alone (longest first) and cut into consecutive batches; a batch's
width is the smallest bucket holding its longest source and its rows follow from the token budget.
A width whose sentences would fill only a few batches (at most 4) is merged into the next wider one in
use: its compile (~1.6 s on 2 CPU cores for the demo's search, about what 35 of its batches take to
decode; tens of seconds on an accelerator) costs more than decoding those sentences a little wider.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transformer_jax.data.epoch_plan import Batch, place_sequences
from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.data.shapes import TRANSLATION_BUCKETS, round_rows, translation_rows, translation_widths

def translation_batches(corpus: EncodedPairs, batch_size: int, batch_tokens: int = 0,
                        items: np.ndarray | None = None, buckets: Sequence[int] = TRANSLATION_BUCKETS,
                        row_multiple: int = 1) -> list[Batch]:
    """The source sentences `items` (default: all) in batches {"inputs": [R, W], "index": [R]}, by source length.

    Sentences are sorted by source length alone (longest first) and cut into consecutive batches; a batch's
    width W is its longest source's `translation_widths` entry, its rows R those of `translation_rows`, so
    there is one shape per width used (a single batch smaller than R when all items fit in fewer rows).
    Rows past the last sentence repeat the batch's last (shortest) source, with index -1: a row of PAD
    would be searched to the length limit, a repeated sentence ends with its original.
    """
    items = np.arange(len(corpus)) if items is None else np.asarray(items)
    if len(items) == 0:
        return []
    lengths = corpus.source.lengths[items]
    sorted_positions = np.argsort(-lengths, kind="stable")
    order = items[sorted_positions]
    widths = translation_widths(lengths, batch_size, batch_tokens, buckets, row_multiple)[sorted_positions]
    # Never more rows than the sentences need (one line from standard input decodes as one row).
    most_rows = round_rows(len(items), row_multiple)
    batches, start = [], 0
    while start < len(order):
        width = int(widths[start])
        rows = min(translation_rows(width, batch_size, batch_tokens, row_multiple), most_rows)
        members = order[start:start + rows]
        start += rows
        filled = np.concatenate([members, np.full(rows - len(members), members[-1])])
        inputs = place_sequences(corpus.source, filled, np.arange(rows), np.zeros(rows, np.int64),
                                 np.ones(rows, np.int64), (rows, width))["tokens"]
        index = np.full(rows, -1, dtype=np.int32)
        index[:len(members)] = members
        batches.append({"inputs": inputs, "index": index})
    return batches
