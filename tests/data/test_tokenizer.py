"""SentencePiece tokenizer: special ids, round trips, byte fallback, the model file written whole."""

import os

import numpy as np
import pytest

from transformer_jax.base import workdir as layout
from transformer_jax.data import tokenizer as tk
from transformer_jax.data.builtin.corpus import builtin_corpus
from transformer_jax.errors import DataError


@pytest.fixture(scope="module")
def pairs():
    return builtin_corpus(num_train=2_000, num_dev=10, num_test=10)["train"]


@pytest.fixture(scope="module")
def trained(pairs, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    path = os.path.join(workdir, layout.TOKENIZER)
    return workdir, tk.train_tokenizer(tk.sample_sentences(pairs, 1_000), path, vocab_size=1_000)


def test_special_ids_are_distinct_and_fixed(trained):
    _, tokenizer = trained
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert [tokenizer.piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 500 < tokenizer.vocab_size <= 1_000


def test_round_trip_on_both_languages(trained, pairs):
    _, tokenizer = trained
    for english, german in pairs[:200]:
        for text in (english, german):
            ids = tokenizer.encode(text)
            assert ids and min(ids) > tk.EOS_ID  # no special id inside a sentence
            assert tokenizer.decode(ids) == text


def test_byte_fallback_represents_unseen_characters(trained):
    _, tokenizer = trained
    text = "Ωμέγα 漢字 🙂"
    ids = tokenizer.encode(text)
    assert tk.UNK_ID not in ids
    assert tokenizer.decode(ids) == text


def test_decode_stops_at_eos_and_skips_bos_and_padding(trained):
    _, tokenizer = trained
    ids = tokenizer.encode("Der Hund.")
    row = np.array([tk.BOS_ID] + ids + [tk.EOS_ID] + ids + [tk.PAD_ID] * 3)
    assert tokenizer.decode(row) == "Der Hund."
    assert tokenizer.decode_batch(np.stack([row, row])) == ["Der Hund."] * 2
    assert tokenizer.encode_batch(["Der Hund.", ""]) == [ids, []]


def test_model_is_saved_whole_and_loads_as_trained(trained):
    workdir, tokenizer = trained
    loaded = tk.Tokenizer.load(os.path.join(workdir, layout.TOKENIZER))
    assert loaded.fingerprint == tokenizer.fingerprint and loaded.vocab_size == tokenizer.vocab_size
    assert [f for f in os.listdir(workdir) if ".tmp" in f] == []


def test_sample_is_drawn_across_the_whole_corpus():
    corpus = [(f"s{i}", f"t{i}") for i in range(10_000)]
    sample = tk.sample_sentences(corpus, 100, seed=0)
    indices = sorted(int(text[1:]) for text in sample if text.startswith("s"))
    assert len(indices) == 100 and len(sample) == 200
    assert indices[-1] > 9_000 and indices[0] < 1_000  # not just the first lines
    assert tk.sample_sentences(corpus, 100, seed=0) == sample


def test_bpe_model_type_and_bad_inputs(tmp_path, pairs):
    sentences = tk.sample_sentences(pairs, 500)
    bpe = tk.train_tokenizer(sentences, str(tmp_path / "bpe.model"), vocab_size=600, model_type="bpe")
    assert bpe.decode(bpe.encode(pairs[0][1])) == pairs[0][1]
    with pytest.raises(DataError, match="model_type"):
        tk.train_tokenizer(sentences, str(tmp_path / "x.model"), model_type="wordpiece")
    with pytest.raises(DataError, match="empty"):
        tk.train_tokenizer([], str(tmp_path / "y.model"))
    with pytest.raises(DataError, match="does not exist"):
        tk.Tokenizer.load(str(tmp_path / "missing.model"))
    assert not (tmp_path / "x.model").exists() and not (tmp_path / "y.model").exists()
