"""Translation batches: by source length alone, rows by token budget, small widths merged into wider ones."""

import numpy as np

from transformer_jax.data import translation_batches as tb
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.model.special_tokens import EOS_ID
from transformer_jax.model.masks import PAD_ID


def smallest_bucket(length: int) -> int:
    return min(b for b in tb.TRANSLATION_BUCKETS if b >= length)


def sources(lengths) -> EncodedPairs:
    return EncodedPairs(Ragged.from_lists([[5] * (n - 1) + [EOS_ID] for n in lengths]),
                        Ragged.from_lists([[6, EOS_ID]] * len(lengths)))


def test_translation_batches_group_by_source_length_alone_within_a_token_budget():
    rng = np.random.default_rng(0)
    source_lengths = rng.integers(1, 41, size=50)
    # Targets far longer than sources: only source lengths may choose the widths.
    corpus = EncodedPairs(Ragged.from_lists([[5] * (n - 1) + [EOS_ID] for n in source_lengths]),
                          Ragged.from_lists([[6] * 99 + [EOS_ID]] * 50))
    items = np.flatnonzero(source_lengths > 1)
    batches = tb.translation_batches(corpus, batch_size=8, batch_tokens=64, items=items)
    indices = np.concatenate([b["index"] for b in batches])
    assert sorted(indices[indices >= 0].tolist()) == items.tolist()  # each item once, no other pair
    real = indices[indices >= 0]
    assert (np.diff(source_lengths[real]) <= 0).all()  # longest first
    widths = tb.translation_widths(source_lengths[items], 8, 64)
    for batch in batches:
        rows, width = batch["inputs"].shape
        assert rows == min(8, 64 // width) and width in tb.TRANSLATION_BUCKETS
        members = batch["index"][batch["index"] >= 0]
        assert width == widths[items == members[0]][0] >= smallest_bucket(source_lengths[members].max())
        for row, item in enumerate(members):
            assert batch["inputs"][row].tolist() == [5] * (source_lengths[item] - 1) + [EOS_ID] + [PAD_ID] * (
                width - source_lengths[item])
        # Rows past the sentences repeat the last one (which ends with it) rather than being all PAD.
        assert (batch["inputs"][len(members):] == batch["inputs"][len(members) - 1]).all()
    # Narrow widths with at most four batches' worth of sentences are decoded wider: fewer shapes (the 9
    # sentences of width 8 join width 16, whose 14 then join width 24).
    assert {b["inputs"].shape for b in batches} == {(2, 24), (2, 32), (1, 48)}
    # A mesh of 4 devices: rows a multiple of 4 (at least 4); a single line: one row.
    row_counts = {b["inputs"].shape[0] for b in tb.translation_batches(corpus, 8, 64, row_multiple=4)}
    assert 4 in row_counts and row_counts <= {4, 8}
    assert [b["inputs"].shape for b in tb.translation_batches(corpus, 8, 64, items=[3])] == [
        (1, smallest_bucket(source_lengths[3]))]



def test_a_width_with_few_sentences_joins_the_next_wider_one():
    # 100 sentences of 12 tokens (width 16) and 256 of 4 tokens (width 8): 256 fill exactly four
    # batches of 64 rows, so the short ones are decoded at width 16: one shape, one compile.
    few = sources([12] * 100 + [4] * 256)
    assert {b["inputs"].shape for b in tb.translation_batches(few, 64)} == {(64, 16)}
    assert tb.translation_widths(np.array([12] * 100 + [4] * 256), 64, 0).tolist() == [16] * 356
    # 257 short ones fill more than four batches: they keep their own width.
    many = sources([12] * 100 + [4] * 257)
    assert {b["inputs"].shape for b in tb.translation_batches(many, 64)} == {(64, 16), (64, 8)}
    # The widest width in use never merges (nothing is wider), and lengths past the last bucket
    # round up to its multiples.
    assert tb.translation_widths(np.array([300, 4]), 64, 0).tolist() == [512, 512]
    assert tb.translation_widths(np.array([300]), 64, 0).tolist() == [512]
