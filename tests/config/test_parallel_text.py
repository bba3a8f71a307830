"""configs/parallel_text.py's sizing (transformer_jax/config/parallel_text.py): tiers by corpus size, a vocabulary a
small corpus supports, the layout read, and one-line errors for a wrong directory or language codes."""

import json
import random
import subprocess
import sys

import pytest

from runs import ROOT, assert_one_line_error, run_script, script_env
from transformer_jax.config import check_run_config, parallel_text_config
from transformer_jax.config.parallel_text import TIERS, survey, tier_for
from transformer_jax.data.tokenizer import train_tokenizer
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
    # Fewer than the words' bound: each word is seen about once, and SentencePiece builds fewer pieces from them.
    assert found.pairs == 400 and 256 < config.data.vocab_size < 256 + found.distinct_words // 2 < 4_000
    train_tokenizer(found.sentences, str(tmp_path / "t.model"), config.data.vocab_size, exact_size=True)
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



def write_made_up_text(directory, pairs: int, seed: int = 0):
    """train.en/.de of made-up sentences: words of random letters, most seen once or twice."""
    rng = random.Random(seed)

    def sentence(letters: str) -> str:
        words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(rng.randint(3, 15))]
        return " ".join(words).capitalize() + rng.choice([" .", " ?", " !", ","])

    directory.mkdir()
    for lang, letters in (("en", "abcdefghijklmnoprstuvwy"), ("de", "abcdefghiklmnorstuwzäöüß")):
        (directory / f"train.{lang}").write_text("".join(sentence(letters) + "\n" for _ in range(pairs)))
    return directory


@pytest.mark.parametrize("write", [write_text, write_made_up_text], ids=["numbered_words", "made_up_words"])
def test_prepare_with_the_automatic_sizes_alone_succeeds_on_a_400_pair_corpus(tmp_path, write):
    """The automatic vocabulary is one SentencePiece reaches on the corpus: numbered words (w0..w4999, each seen
    about once) promise 256 + distinct words / 2 = 1,656 pieces, and give 906."""
    corpus, output = write(tmp_path / "c", 400), tmp_path / "out"
    for split in ("dev", "test"):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("".join(f"w{i} w{i + 1} .\n" for i in range(20)))
    config = parallel_text_config(str(corpus), "en", "de")
    if write is write_text:
        assert config.data.vocab_size < 256 + survey(str(corpus), "en", "de").distinct_words // 2
    result = subprocess.run([sys.executable, "-m", "transformer_jax.cli.prepare",
                             f"--config=parallel_text:{corpus},en,de", f"--output={output}"],
                            cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((output / "manifest.json").read_text())
    assert (manifest["pairs"], manifest["vocab_size"]) == (400, config.data.vocab_size)
