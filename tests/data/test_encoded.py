"""Tokenized corpora: flat ragged storage, EOS handling, length filtering for training."""

import numpy as np
import pytest

from transformer_jax.data.encoded import (
    EncodedPairs,
    Ragged,
    encode_pairs,
    filter_by_length,
)
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID
from transformer_jax.errors import DataError


def test_ragged_round_trip_and_select():
    sequences = [[5, 6, 7], [], [8], [9, 10]]
    ragged = Ragged.from_lists(sequences)
    assert len(ragged) == 4 and ragged.values.dtype == np.int32
    assert [ragged[i].tolist() for i in range(4)] == sequences
    picked = ragged.select(np.array([3, 0]))
    assert [picked[i].tolist() for i in range(2)] == [[9, 10], [5, 6, 7]]
    empty = Ragged.from_lists([])
    assert len(empty) == 0 and empty.starts.shape == empty.lengths.shape == (0,)


def test_encode_pairs_appends_eos_to_both_sides_and_no_bos(tmp_path):
    pairs = [("the dog sleeps", "der Hund schläft"), ("", "leer")] * 50
    tokenizer = train_tokenizer([text for pair in pairs for text in pair], str(tmp_path / "t.model"), vocab_size=300)
    encoded = encode_pairs(pairs, tokenizer)
    assert len(encoded) == 100
    source, target = encoded.source[0].tolist(), encoded.target[0].tolist()
    assert source[-1] == target[-1] == EOS_ID and BOS_ID not in source + target
    assert tokenizer.decode(source) == "the dog sleeps" and tokenizer.decode(target) == "der Hund schläft"
    assert encoded.source[1].tolist() == [EOS_ID]  # an empty line stays, as EOS alone


def test_length_filter_drops_long_pairs_and_counts_them():
    corpus = EncodedPairs(Ragged.from_lists([[5, EOS_ID], [6] * 9 + [EOS_ID], [7, EOS_ID]]),
                          Ragged.from_lists([[8, EOS_ID], [9, EOS_ID], [10] * 7 + [EOS_ID]]))
    filtered, dropped = filter_by_length(corpus, 8)
    assert dropped == 1 and [filtered.source[i].tolist() for i in range(2)] == [[5, EOS_ID], [7, EOS_ID]]
    with pytest.raises(DataError, match="max_length=1"):
        filter_by_length(corpus, 1)


def test_chunked_encoding_equals_encoding_at_once(tmp_path):
    pairs = [(f"sentence number {i} " * (i % 5), f"Satz Nummer {i}") for i in range(103)]
    tokenizer = train_tokenizer([text for pair in pairs for text in pair], str(tmp_path / "t.model"), vocab_size=300)
    whole, chunked = encode_pairs(pairs, tokenizer, chunk_size=1_000), encode_pairs(pairs, tokenizer, chunk_size=10)
    consumed = list(pairs)
    assert np.array_equal(encode_pairs(consumed, tokenizer, chunk_size=10, consume=True).target.values,
                          whole.target.values) and consumed == []
    for side in ("source", "target"):
        expected = Ragged.from_lists([ids + [EOS_ID] for ids in tokenizer.encode_batch([p[side == "target"]
                                                                                      for p in pairs])])
        for corpus in (whole, chunked):
            got = getattr(corpus, side)
            assert [got[i].tolist() for i in range(len(pairs))] == [expected[i].tolist() for i in range(len(pairs))]
            assert np.array_equal(got.values, expected.values) and got.values.dtype == np.int32
