"""The packed row width chosen from the corpus: narrow rows for short sentences, max_length for long ones."""

import numpy as np
import pytest

from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.data.row_width import choose_row_width, epoch_cost
from transformer_jax.model.config import TransformerConfig

SMALL = TransformerConfig(vocab_size=8_000, num_layers=3, d_model=256, d_ff=1_024, num_heads=4, max_len=257)


def lognormal_corpus(num_pairs: int, median: float, longest: int = 256, seed: int = 0) -> EncodedPairs:
    """Pairs of lognormal lengths (targets about 10% longer), ids irrelevant here."""
    rng = np.random.default_rng(seed)
    source = np.clip(rng.lognormal(np.log(median), 0.55, num_pairs), 2, longest).astype(np.int32)
    target = np.clip(source * rng.lognormal(0.1, 0.15, num_pairs), 2, longest).astype(np.int32)
    sides = [Ragged(np.full(int(n.sum()), 5, np.int32), np.cumsum(n, dtype=np.int64) - n, n) for n in (source, target)]
    return EncodedPairs(*sides)


@pytest.mark.parametrize("median, model, saving", [(10, SMALL, 0.8), (23, TransformerConfig(vocab_size=32_000), 0.95)])
def test_short_sentences_get_narrow_rows_that_the_cost_model_prices_below_rows_of_max_length(median, model, saving):
    corpus = lognormal_corpus(8_000, median)
    longest = int(max(corpus.source.lengths.max(), corpus.target.lengths.max()))
    width = choose_row_width(corpus, model, 4_096, 256)
    assert 16 <= width < longest and width == choose_row_width(corpus, model, 4_096, 256)  # deterministic
    lengths = corpus.source.lengths, corpus.target.lengths
    long_width = -(-longest // 8) * 8
    chosen, max_length_rows = epoch_cost(*lengths, model, 4_096, width, long_width), epoch_cost(*lengths, model, 4_096,
                                                                                                  256, 256)
    assert chosen < saving * max_length_rows
    # Most pairs fit the width: the long ones are few, in rows of their own.
    assert np.mean(np.maximum(*lengths) <= width) > 0.95
    iterator = BatchIterator(corpus, 4_096, 256, row_width=width)
    assert iterator.widths() == [width, long_width]


def test_long_sentences_keep_one_width_and_the_width_never_exceeds_max_length():
    corpus = lognormal_corpus(3_000, median=150, longest=200)
    assert choose_row_width(corpus, SMALL, 8_192, 256) >= 168  # about the longest pair (200, a multiple of 8)
    assert choose_row_width(corpus, SMALL, 8_192, 128) <= 128
