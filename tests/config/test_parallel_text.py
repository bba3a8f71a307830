"""configs/parallel_text.py's sizing (transformer_jax/config/parallel_text.py): tiers by corpus size, a vocabulary a
small corpus supports, the layout read, one-line errors for a wrong directory or language codes, the derived settings
recomputed after overrides (a contradicting one refused) and the sizes a run prints."""

import json
import random
import subprocess
import sys

import pytest

from runs import ROOT, assert_one_line_error, run_script, script_env
from transformer_jax.config import check_run_config, default_config, parallel_text_config, sizing_line
from transformer_jax.config.parallel_text import TIERS, survey, tier_for
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.errors import ConfigError, DataError


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


def write_splits(corpus):
    """dev.* and test.* beside the training text: a corpus a run can train and score on."""
    for split in ("dev", "test"):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("".join(f"w{i} w{i + 1} .\n" for i in range(8)))
    return corpus


def load_config(corpus, *overrides: str):
    """The config `--config=configs/parallel_text.py:CORPUS,en,de OVERRIDES` gives, loaded by ml_collections'
    config_flags as the commands load it."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["train", f"--config={ROOT / 'configs' / 'parallel_text.py'}:{corpus},en,de", *overrides]
    flag_values = flags.FlagValues()
    # sys_argv: the command line whose --config.KEY overrides become flags (else the process's own).
    config_flags.DEFINE_config_file("config", flag_values=flag_values, lock_config=True, sys_argv=argv)
    flag_values(argv)
    return flag_values.config


def test_settings_derived_from_an_overridden_one_are_recomputed_after_the_override(tmp_path):
    corpus = write_text(tmp_path / "c", 400)
    sized = load_config(corpus)
    assert sized.training.num_train_steps > 20 and sized.training.warmup_steps > 1
    config = load_config(corpus, "--config.training.num_train_steps=6", "--config.data.max_length=600",
                         "--config.eval.average_last=8")
    check_run_config(config)
    training = config.training
    assert (training.num_train_steps, training.warmup_steps, training.log_every, training.eval_every,
            training.checkpoint_every) == (6, 1, 1, 1, 1)
    assert (config.model.max_len, training.keep_checkpoints) == (601, 8)
    # The run length itself follows the batch: half the tokens per batch, about twice the steps.
    halved = load_config(corpus, f"--config.data.tokens_per_batch={sized.data.tokens_per_batch // 2}")
    assert abs(halved.training.num_train_steps - 2 * sized.training.num_train_steps) <= 1
    assert halved.training.warmup_steps == halved.training.num_train_steps // 5


def test_a_derived_setting_set_explicitly_is_kept_and_one_that_contradicts_the_run_is_refused(tmp_path):
    corpus = write_text(tmp_path / "c", 400)
    config = load_config(corpus, "--config.training.warmup_steps=5", "--config.training.num_train_steps=6")
    check_run_config(config)
    assert (config.training.warmup_steps, config.training.log_every) == (5, 1)
    config = load_config(corpus, "--config.training.warmup_steps=9", "--config.training.num_train_steps=6")
    with pytest.raises(ConfigError, match=r"^training.warmup_steps=9 is more than training.num_train_steps=6 "
                                          r"\(the warm-up would never end\); set --config.training.warmup_steps to 6 "
                                          "or less, or leave it out"):
        check_run_config(config)
    # The same contradiction in a config not sized from a corpus is the user's own schedule: not refused.
    plain = default_config()
    plain.training.update(num_train_steps=2, warmup_steps=3)
    check_run_config(plain)
    assert sizing_line(plain) is None


def test_the_train_command_refuses_a_warm_up_longer_than_the_run_before_any_work(tmp_path):
    corpus = write_splits(write_text(tmp_path / "c", 400))
    result = run_script("train.py", f"--config=parallel_text:{corpus},en,de", f"--workdir={tmp_path / 'r'}",
                        "--config.training.num_train_steps=6", "--config.training.warmup_steps=9")
    assert_one_line_error(result, "training.warmup_steps=9 is more than training.num_train_steps=6",
                          "--config.training.warmup_steps to 6 or less")
    assert not (tmp_path / "r").exists()


def test_a_run_sized_from_its_corpus_prints_its_sizes_once_and_trains_with_the_recomputed_schedule(tmp_path):
    corpus, workdir = write_splits(write_text(tmp_path / "c", 400)), tmp_path / "r"
    tiny = ("--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
            "--config.model.num_heads=2", "--config.eval.beam_size=2", "--config.eval.max_extra_length=4")
    result = run_script("train.py", f"--config=parallel_text:{corpus},en,de", f"--workdir={workdir}",
                        "--config.training.num_train_steps=3", *tiny)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("sized from the corpus")]
    saved = json.loads((workdir / "config.json").read_text())
    vocab = saved["data"]["vocab_size"]
    assert lines == [f"sized from the corpus (400 training pairs in {corpus}: tier tiny): model.num_layers=1, "
                     f"model.d_model=32, data.vocab_size={vocab}, data.tokens_per_batch=4096, "
                     "training.num_train_steps=3, training.warmup_steps=1; set by the config or command line, not "
                     "derived: training.num_train_steps"]
    assert (saved["training"]["num_train_steps"], saved["training"]["warmup_steps"]) == (3, 1)
