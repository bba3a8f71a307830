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
    with pytest.raises(DataError, match=r"^tokenizer model_type='wordpiece' is not supported; use 'unigram' or 'bpe'$"):
        tk.train_tokenizer(sentences, str(tmp_path / "x.model"), model_type="wordpiece")
    with pytest.raises(DataError, match="empty"):
        tk.train_tokenizer([], str(tmp_path / "y.model"))
    with pytest.raises(DataError, match="does not exist"):
        tk.Tokenizer.load(str(tmp_path / "missing.model"))
    assert not (tmp_path / "x.model").exists() and not (tmp_path / "y.model").exists()


def test_the_run_config_offers_the_model_types_trained_here_not_a_copy_of_them():
    from transformer_jax.config import SETTINGS

    assert next(setting for setting in SETTINGS if setting.key == "data.tokenizer_type").choices is tk.TOKENIZER_TYPES


def test_a_vocabulary_too_small_for_the_characters_names_the_least_size_and_that_size_trains(tmp_path):
    sentences = ["".join(chr(0x4E00 + (i * 7 + j) % 300) for j in range(20)) for i in range(300)]  # 300 characters
    with pytest.raises(DataError, match=r"need (\d+)\); set --config.data.vocab_size=\1 or more") as raised:
        tk.train_tokenizer(sentences, str(tmp_path / "small.model"), vocab_size=300, exact_size=True)
    least = int(str(raised.value).rsplit("=", 1)[1].split()[0])
    assert least > 300 + 256  # the characters, the byte pieces and the special ones
    assert tk.train_tokenizer(sentences, str(tmp_path / "t.model"), vocab_size=least, exact_size=True).vocab_size == least
    assert not (tmp_path / "small.model").exists()


def test_the_supported_size_is_the_asked_one_or_the_most_the_text_gives_and_exact_training_accepts_it(tmp_path, pairs):
    sentences = tk.sample_sentences(pairs, 1_000)
    assert tk.supported_vocab_size(sentences, 600) == 600
    numbered = [" ".join(f"w{(i * 7 + j) % 5000}" for j in range(8)) for i in range(400)]  # each word seen about once
    most = tk.supported_vocab_size(numbered, 1_600)
    assert 256 < most < 1_600
    assert tk.train_tokenizer(numbered, str(tmp_path / "t.model"), vocab_size=most, exact_size=True).vocab_size == most
    with pytest.raises(DataError, match=f"SentencePiece built only {most} pieces"):
        tk.train_tokenizer(numbered, str(tmp_path / "u.model"), vocab_size=most + 1, exact_size=True)
