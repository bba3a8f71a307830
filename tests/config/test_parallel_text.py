"""configs/parallel_text.py's sizing (transformer_jax/config/parallel_text.py): tiers by corpus size, a vocabulary a
small corpus supports, the layout read, and one-line errors for a wrong directory or language codes."""

import pytest

from runs import ROOT, assert_one_line_error, run_script
from transformer_jax.config import check_run_config, parallel_text_config
from transformer_jax.config.parallel_text import TIERS, survey, tier_for
from transformer_jax.errors import DataError


def write_text(directory, pairs: int, words_per_line: int = 8, layout: str = "text"):
    directory.mkdir(exist_ok=True)
    lines = [" ".join(f"w{(i * 7 + j) % 5000}" for j in range(words_per_line)) for i in range(pairs)]
    if layout == "text":
        for lang in ("en", "de"):
            (directory / f"train.{lang}").write_text("".join(line + "\n" for line in lines))
    else:
        (directory / "train.tsv").write_text("de\ten\n" + "".join(f"{line}\t{line}\n" for line in lines))
    return directory


def test_tiers_grow_with_the_corpus_and_cover_every_size():
    assert [tier_for(pairs).name for pairs in (1, 19_999, 20_000, 499_999, 500_000, 9_999_999, 10**9)] == [
        "tiny", "tiny", "small", "small", "base", "base", "big"]
    sizes = [tier.model["d_model"] * tier.model["num_layers"] * tier.model["d_ff"] for tier in TIERS]
    assert sizes == sorted(sizes)


def test_a_small_corpus_gets_the_small_model_a_vocabulary_it_supports_and_steps_by_epochs(tmp_path):
    config = parallel_text_config(str(write_text(tmp_path / "c", 400)), "en", "de")
    check_run_config(config)
    assert config.data.source == "text" and config.model.d_model == 128
    found = survey(str(tmp_path / "c"), "en", "de")
    assert found.pairs == 400 and config.data.vocab_size == 256 + found.distinct_words // 2 < 4_000
    more = parallel_text_config(str(write_text(tmp_path / "d", 4_000)), "en", "de")
    assert more.training.num_train_steps > config.training.num_train_steps  # more text, more steps
    assert more.training.warmup_steps < more.training.num_train_steps


def test_a_tsv_corpus_is_surveyed_and_read_by_its_header(tmp_path):
    config = parallel_text_config(str(write_text(tmp_path / "c", 300, layout="tsv")), "en", "de")
    assert config.data.source == "tsv"
    assert survey(str(tmp_path / "c"), "en", "de").pairs == 301  # the header line is counted: close enough


def test_wrong_directory_or_languages_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="is not a directory"):
        parallel_text_config(str(tmp_path / "missing"), "en", "de")
    with pytest.raises(DataError, match="neither train.fr and train.de nor train.tsv"):
        parallel_text_config(str(write_text(tmp_path / "c", 10)), "fr", "de")
    with pytest.raises(DataError, match="two different codes"):
        parallel_text_config(str(tmp_path / "c"), "de", "de")
    result = run_script("train.py", "--config=configs/parallel_text.py:only_a_path", f"--workdir={tmp_path / 'r'}")
    assert_one_line_error(result, "configs/parallel_text.py needs DIR,SRC,TGT")
    assert not (tmp_path / "r").exists() and ROOT.exists()
