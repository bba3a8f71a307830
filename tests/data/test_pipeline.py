"""prepare_data: the row width from the corpus, and the prepared training corpus a resume reads (and checks)."""

import os

import numpy as np
import pytest

from transformer_jax.base import workdir as layout
from transformer_jax.data import pipeline
from transformer_jax.errors import ConfigError, DataError
from transformer_jax.config.schema import check_run_config, default_config


def tiny_config():
    config = default_config()
    config.data.update(source="builtin", builtin_train_size=600, builtin_dev_size=16, builtin_test_size=16,
                       vocab_size=500, tokenizer_sample_size=1200, tokens_per_batch=1_024, max_length=64)
    config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2, max_len=128)
    return config


def test_a_resume_reads_the_prepared_corpus_instead_of_encoding_the_training_text(tmp_path, monkeypatch):
    workdir = str(tmp_path)
    first = pipeline.prepare_data(tiny_config(), workdir)
    assert os.path.exists(os.path.join(workdir, layout.CORPUS, "manifest.json"))
    assert os.path.exists(os.path.join(workdir, layout.TOKENIZER))  # the corpus's, kept with the run
    assert first.train.pack and first.train.row_width <= 64
    assert first.train.get_state()["layout"]["row_width"] == first.train.row_width
    assert first.train.get_state()["layout"]["rows_sized_for"] == "real tokens"  # the automatic width (row_width.py)
    encoded = []
    real_encode = pipeline.encode_pairs
    monkeypatch.setattr(pipeline, "encode_pairs", lambda pairs, tokenizer, **options: encoded.append(len(pairs))
                        or real_encode(pairs, tokenizer, **options))
    again = pipeline.prepare_data(tiny_config(), workdir)
    assert encoded == [16, 16]  # dev and test only
    assert again.train.row_width == first.train.row_width
    for _ in range(3):
        expected, got = next(first.train), next(again.train)
        assert all(np.array_equal(got[key], expected[key]) for key in expected)


@pytest.mark.parametrize("setting, value", [("builtin_train_size", 500), ("builtin_test_size", 20),
                                            ("builtin_dev_size", 8), ("vocab_size", 400)])
def test_a_resume_with_other_corpus_settings_is_refused_and_nothing_is_rewritten(tmp_path, setting, value):
    """Any setting that changes which pairs are training pairs (the built-in split sizes included: the test
    sentences would otherwise be trained on) or the tokenizer is refused on the same workdir."""
    workdir = str(tmp_path)
    pipeline.prepare_data(tiny_config(), workdir)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    other = tiny_config()
    other.data[setting] = value
    with pytest.raises(DataError, match=f"data.{setting}={value} differs from the .* use a new workdir"):
        pipeline.prepare_data(other, workdir)
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_train_and_test_never_overlap_for_any_allowed_builtin_sizes(tmp_path):
    for sizes in ((600, 16, 16), (600, 16, 300)):
        config = tiny_config()
        config.data.update(builtin_train_size=sizes[0], builtin_dev_size=sizes[1], builtin_test_size=sizes[2])
        corpus, _ = pipeline.run_corpus(config, str(tmp_path / str(sizes[2])))
        train = set(corpus.manifest and pipeline.load_run_splits(config.data, 0, ("train",))["train"])
        assert len(corpus.split("test")) == sizes[2] and not train & set(corpus.split("test"))
        assert not train & set(corpus.split("dev"))


def test_an_explicit_row_width_is_used_and_one_wider_than_max_length_is_a_config_error(tmp_path):
    config = tiny_config()
    config.data.row_width = 24
    explicit = pipeline.prepare_data(config, str(tmp_path)).train
    # An explicit width keeps rows of tokens_per_batch slots: 1_024 // 24 rows.
    assert explicit.widths()[0] == 24 and explicit.shapes()[0] == (42, 24)
    assert explicit.get_state()["layout"]["rows_sized_for"] == "slots"
    config.data.row_width = 65
    with pytest.raises(ConfigError, match="row_width=65 is wider than data.max_length=64"):
        check_run_config(config)
