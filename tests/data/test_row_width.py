"""Packed rows chosen from the corpus: narrow rows for short sentences, as many real tokens as rows of max_length."""

import numpy as np
import pytest

from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.data.row_width import (
    activation_elements_per_row,
    candidate_widths,
    choose_packed_rows,
    epoch_cost,
    packed_rows,
)
from transformer_jax.model.config import TransformerConfig

SMALL = TransformerConfig(vocab_size=8_000, num_layers=3, d_model=256, d_ff=1_024, num_heads=4, max_len=257)


def lognormal_corpus(num_pairs: int, median: float, longest: int = 256, seed: int = 0) -> EncodedPairs:
    """Pairs of lognormal lengths (targets about 10% longer), ids irrelevant here."""
    rng = np.random.default_rng(seed)
    source = np.clip(rng.lognormal(np.log(median), 0.55, num_pairs), 2, longest).astype(np.int32)
    target = np.clip(source * rng.lognormal(0.1, 0.15, num_pairs), 2, longest).astype(np.int32)
    sides = [Ragged(np.full(int(n.sum()), 5, np.int32), np.cumsum(n, dtype=np.int64) - n, n) for n in (source, target)]
    return EncodedPairs(*sides)


def shuffled_lengths(corpus: EncodedPairs) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' lengths in the fixed random order choose_packed_rows samples them in."""
    order = np.random.default_rng(0).permutation(len(corpus))
    return corpus.source.lengths[order].astype(np.int64), corpus.target.lengths[order].astype(np.int64)


@pytest.mark.parametrize("median, model, saving", [(10, SMALL, 0.8), (23, TransformerConfig(vocab_size=32_000), 0.95)])
def test_short_sentences_get_narrow_rows_that_the_cost_model_prices_below_rows_of_max_length(median, model, saving):
    corpus = lognormal_corpus(8_000, median)
    longest = int(max(corpus.source.lengths.max(), corpus.target.lengths.max()))
    chosen = choose_packed_rows(corpus, model, 4_096, 256)
    width = chosen.width
    assert 16 <= width < longest and chosen == choose_packed_rows(corpus, model, 4_096, 256)  # deterministic
    lengths = shuffled_lengths(corpus)
    long_width = -(-longest // 8) * 8
    max_length_rows = packed_rows(*lengths, model, 4_096, 256, 256)
    assert max_length_rows.rows == {256: 16}  # rows of max_length: tokens_per_batch // 256, as always
    assert epoch_cost(*lengths, model, chosen) < saving * epoch_cost(*lengths, model, max_length_rows)
    # Most pairs fit the width: the long ones are few, in rows of their own.
    assert np.mean(np.maximum(*lengths) <= width) > 0.95
    iterator = BatchIterator(corpus, 4_096, 256, row_width=width, rows_per_width=chosen.rows)
    assert iterator.widths() == [width, long_width] and chosen.long_width == long_width
    assert [rows for rows, _ in iterator.shapes()] == [chosen.rows[width], chosen.rows[long_width]]


def test_long_sentences_keep_one_width_and_the_width_never_exceeds_max_length():
    corpus = lognormal_corpus(3_000, median=150, longest=200)
    assert choose_packed_rows(corpus, SMALL, 8_192, 256).width >= 168  # about the longest pair (200, a multiple of 8)
    assert choose_packed_rows(corpus, SMALL, 8_192, 128).width <= 128


def real_target_tokens_per_full_batch(iterator: BatchIterator, corpus: EncodedPairs) -> float:
    """Mean real target tokens of the epoch's batches whose rows all hold pairs (a width's last batch need not)."""
    plan = iterator.plan(0)
    tokens = []
    for b in range(len(plan)):
        members = slice(plan.batch_starts[b], plan.batch_starts[b + 1])
        if len(np.unique(plan.rows[members])) == plan.batch_rows[b]:
            tokens.append(int(corpus.target.lengths[plan.items[members]].sum()))
    return float(np.mean(tokens))


def test_every_width_holds_the_real_tokens_of_rows_of_max_length_within_their_memory():
    """Narrow rows pack less tightly: sized by slots they hold 5-10% fewer real tokens than rows of max_length
    (the demo's lost BLEU); sized by the measured fill they hold as many, and no batch needs more memory."""
    corpus = lognormal_corpus(30_000, median=10)
    lengths = shuffled_lengths(corpus)
    reference = real_target_tokens_per_full_batch(BatchIterator(corpus, 4_096, 256, row_multiple=4), corpus)
    memory = 16 * activation_elements_per_row(SMALL, 256)  # a batch of rows of max_length: 4_096 // 256 rows
    for width in (16, 24, 32, 48):
        layout = packed_rows(*lengths, SMALL, 4_096, 256, width, row_multiple=4)
        assert layout.long_width == 96 and all(rows % 4 == 0 for rows in layout.rows.values())
        sized = BatchIterator(corpus, 4_096, 256, row_multiple=4, row_width=width, rows_per_width=layout.rows)
        assert real_target_tokens_per_full_batch(sized, corpus) == pytest.approx(reference, rel=0.025)
        assert all(rows * activation_elements_per_row(SMALL, w) <= memory for rows, w in sized.shapes())
        slots = BatchIterator(corpus, 4_096, 256, row_multiple=4, row_width=width)
        if width <= 24:
            assert real_target_tokens_per_full_batch(slots, corpus) < 0.92 * reference
    # The long pairs (32 to 96 tokens, one or two to a 96-token row) are capped by memory below the average;
    # the narrow rows make up for them.
    layout = packed_rows(*lengths, SMALL, 4_096, 256, 48)
    assert layout.real_tokens(96) < 0.8 * layout.real_tokens(48)
    assert layout.rows[96] * activation_elements_per_row(SMALL, 96) <= memory
    assert layout.real_tokens(48) > 1.01 * layout.reference_fill * 4_096


def test_on_accelerators_the_candidate_widths_are_multiples_of_the_chip_tile():
    from transformer_jax.data.shapes import width_multiple

    assert width_multiple("tpu") == 128 and width_multiple("gpu") == 64 and width_multiple("cpu") == 8
    assert candidate_widths(200, 256, 25_000, 8, width_multiple("tpu")) == [128, 256]
    assert candidate_widths(300, 320, 25_000, 8, width_multiple("tpu")) == [128, 256, 320]  # max_length caps
    assert candidate_widths(200, 256, 25_000, 8, width_multiple("gpu")) == [64, 128, 192, 256]
    assert all(width % 8 == 0 for width in candidate_widths(200, 256, 25_000, 8))
