"""A run config for your own parallel text, sized from the corpus (configs/parallel_text.py).

Given the directory and the two languages, `parallel_text_config` reads the layout (`train.SRC`/`train.TGT`
or `train.tsv`), counts the training pairs and their length, and chooses the model, the vocabulary, the
batch and the schedule by corpus size (`TIERS`). Any choice can be overridden on the command line
(`--config.model.num_layers=4`); the settings that follow from others (the steps from the batch, the warm-up, logs
and checkpoints from the steps) are recomputed from the final values, unless set themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import ml_collections

from transformer_jax.config.derived import derive, derived_settings
from transformer_jax.config.settings import default_config
from transformer_jax.data.tokenizer import supported_vocab_size
from transformer_jax.errors import DataError

BYTES_PER_TOKEN = 4.0  # a SentencePiece piece of European text is about 4 UTF-8 bytes (for the step count)
SAMPLE_BYTES = 8 << 20  # the distinct words that bound a small corpus's vocabulary are counted in this much text
# A training text of at most this many bytes (both sides) is small enough that its words may not support the tier's
# vocabulary: a tokenizer is trained on it (seconds) to find the size SentencePiece reaches. Larger corpora (tens of
# thousands of pairs) reach their tier's size.
TRIAL_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Tier:
    """The settings for corpora of fewer than `max_pairs` training pairs."""

    max_pairs: float
    name: str
    model: dict
    vocab_size: int
    tokens_per_batch: int
    epochs: int
    max_steps: int
    average_last: int
    peak_learning_rate: float = 0.0  # 0: the paper's formula (d_model^-0.5 * warmup^-0.5 at the peak)


TIERS = (
    # A few thousand sentences: a model that trains in minutes on a CPU (configs/demo.py's size).
    # Its steps are few, so its warm-up is short: a set peak rate, not the formula's (which peaks higher).
    Tier(20_000, "tiny", dict(num_layers=2, d_model=128, d_ff=512, num_heads=4, dropout_rate=0.1), 4_000, 4_096,
         60, 20_000, 3, peak_learning_rate=5e-3),
    # IWSLT-sized corpora: fairseq's transformer_iwslt_de_en (6 layers, d_ff 1024, 4 heads, dropout 0.3).
    Tier(500_000, "small", dict(num_layers=6, d_model=512, d_ff=1024, num_heads=4, dropout_rate=0.3), 10_000, 4_096,
         50, 100_000, 5, peak_learning_rate=5e-4),
    # WMT-sized: the paper's base model, batch and schedule (WMT14 EN-DE: 4.5M pairs, 100k steps).
    Tier(10_000_000, "base", dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout_rate=0.1), 32_000,
         25_000, 20, 100_000, 5),
    # Larger: the paper's big model (300k steps; average the last 20 checkpoints).
    Tier(math.inf, "big", dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3), 37_000,
         25_000, 20, 300_000, 20),
)


@dataclasses.dataclass(frozen=True)
class Survey:
    """What the config is sized from: the training pairs, their mean bytes per side, distinct words seen, and the
    whole training text as sentences when it is at most TRIAL_BYTES (else None)."""

    source: str  # "text" or "tsv"
    pairs: int
    bytes_per_pair: float
    distinct_words: int
    sentences: list[str] | None = None


def _lines_and_bytes(path: str, keep: int = 0) -> tuple[int, int, set[str], list[str] | None]:
    """(lines, bytes, the distinct words of the first SAMPLE_BYTES, the lines when the file is at most `keep` bytes)."""
    lines = size = 0
    words: set[str] = set()
    kept: list[bytes] = []
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            if size < SAMPLE_BYTES:
                words.update(block.decode("utf-8", "ignore").split())
            if size + len(block) <= keep:
                kept.append(block)
            lines += block.count(b"\n")
            size += len(block)
            last = block[-1:]
    if size and last != b"\n":
        lines += 1
    text = b"".join(kept).decode("utf-8", "ignore").splitlines() if size <= keep else None
    return lines, size, words, text


def survey(path: str, source_lang: str, target_lang: str) -> Survey:
    """Count the training pairs of `path` (train.SRC and train.TGT, or train.tsv)."""
    if not os.path.isdir(path):
        raise DataError(f"{path} is not a directory; pass the directory holding train.{source_lang} and "
                        f"train.{target_lang} (or train.tsv), e.g. --config=configs/parallel_text.py:DIR,"
                        f"{source_lang},{target_lang}")
    text = [os.path.join(path, f"train.{lang}") for lang in (source_lang, target_lang)]
    if all(os.path.isfile(name) for name in text):
        (pairs, source_bytes, source_words, source), (_, target_bytes, target_words, target) = (
            _lines_and_bytes(name, TRIAL_BYTES // 2) for name in text)
        # Both sides of each pair in turn, as the tokenizer's sample gives them (data/tokenizer.sample_sentences).
        sentences = None if source is None or target is None else [
            side.strip() for pair in zip(source, target) for side in pair if side.strip()]
        return Survey("text", pairs, (source_bytes + target_bytes) / 2 / max(pairs, 1),
                      len(source_words | target_words), sentences)
    tsv = os.path.join(path, "train.tsv")
    if os.path.isfile(tsv):
        pairs, size, words, lines = _lines_and_bytes(tsv, TRIAL_BYTES)
        sentences = None if lines is None else [field.strip() for line in lines for field in line.split("\t")
                                                if field.strip()]
        return Survey("tsv", pairs, size / 2 / max(pairs, 1), len(words), sentences)
    raise DataError(f"{path} has neither train.{source_lang} and train.{target_lang} nor train.tsv; name the "
                    f"training files so (dev.* or valid.*, and optionally test.*, beside them)")


def tier_for(pairs: int) -> Tier:
    """The first tier whose corpora are larger than `pairs`."""
    return next(tier for tier in TIERS if pairs < tier.max_pairs)


def parallel_text_config(path: str, source_lang: str, target_lang: str) -> ml_collections.ConfigDict:
    """The run config for the parallel text in `path`, translating `source_lang` to `target_lang`."""
    if not source_lang or not target_lang or source_lang == target_lang:
        raise DataError(f"the languages {source_lang!r} and {target_lang!r} must be two different codes, as in "
                        "the file names (train.en, train.de): --config=configs/parallel_text.py:DIR,en,de")
    found = survey(path, source_lang, target_lang)
    tier = tier_for(found.pairs)
    config = default_config()
    # A small corpus supports fewer SentencePiece pieces than the tier's: about half its distinct words, plus the
    # 256 byte pieces; a text small enough to train on here is asked (a size it cannot reach would stop the run's
    # `prepare` before training: a text of rare words, each seen once, supports far fewer pieces than it has words).
    vocab_size = min(tier.vocab_size, 256 + max(found.distinct_words // 2, 64))
    if found.sentences:
        vocab_size = supported_vocab_size(found.sentences, vocab_size, config.data.tokenizer_type,
                                          config.data.byte_fallback)
    config.data.update(source=found.source, path=os.path.abspath(path), source_lang=source_lang,
                       target_lang=target_lang, vocab_size=vocab_size, tokens_per_batch=tier.tokens_per_batch,
                       max_length=256 if tier.name in ("base", "big") else 128)
    config.model.update(**tier.model)
    config.training.update(peak_learning_rate=tier.peak_learning_rate,
                           bleu_every=0 if tier.name == "tiny" else 5_000)
    config.eval.average_last = tier.average_last
    _derive_from_the_corpus(config, found, tier, f"{found.pairs} training pairs in {path}: tier {tier.name}")
    return config


def _derive_from_the_corpus(config: ml_collections.ConfigDict, found: Survey, tier: Tier, basis: str) -> None:
    """The settings that follow from others: the steps from the batch, the schedule and logs from the steps, the
    model's length from the pairs'; each recomputed from the final values of those it follows (config/derived.py)."""
    tokens_per_epoch = found.pairs * found.bytes_per_pair / BYTES_PER_TOKEN
    derive(config, "training.num_train_steps", functools.partial(_steps, tier, tokens_per_epoch),
           "data.tokens_per_batch", basis=basis)
    steps = "training.num_train_steps"
    derive(config, "training.warmup_steps", functools.partial(_share, 5, 4_000), steps, at_most=steps,
           reason="the warm-up would never end", basis=basis)
    derive(config, "training.log_every", functools.partial(_share, 20, 100), steps, basis=basis)
    for key in ("training.eval_every", "training.checkpoint_every"):
        derive(config, key, functools.partial(_share, 10, 1_000), steps, basis=basis)
    derive(config, "training.keep_checkpoints", functools.partial(max, 5), "eval.average_last", basis=basis)
    derive(config, "model.max_len", functools.partial(_longest, config.model.max_len), "data.max_length", basis=basis)


def _steps(tier: Tier, tokens_per_epoch: float, tokens_per_batch: int) -> int:
    """The tier's epochs over the corpus in batches of `tokens_per_batch`, within 20 and the tier's most steps."""
    return int(min(tier.max_steps, max(20, math.ceil(tier.epochs * tokens_per_epoch / tokens_per_batch))))


def _share(parts: int, most: int, steps: int) -> int:
    """One `parts`-th of the run's steps, at least 1 and at most `most`."""
    return max(1, min(most, steps // parts))


def _longest(least: int, max_length: int) -> int:
    """The model's length: room for the longest training pair and its BOS, at least `least`."""
    return max(least, max_length + 1)


def sizing_line(config: ml_collections.ConfigDict) -> str | None:
    """The line a run sized from its corpus prints at start: the tier, the model, vocabulary, batch and steps it
    runs with (after overrides), and which derived settings were set by hand; None for a config not so sized."""
    derived = derived_settings(config)
    if not derived:
        return None
    shown = ("model.num_layers", "model.d_model", "data.vocab_size", "data.tokens_per_batch",
             "training.num_train_steps", "training.warmup_steps")
    values = ", ".join(f"{key}={config[key.partition('.')[0]][key.partition('.')[2]]}" for key in shown)
    explicit = [key for key, setting in derived.items() if setting.explicit]
    given = f"; set by the config or command line, not derived: {', '.join(explicit)}" if explicit else ""
    return f"sized from the corpus ({next(iter(derived.values())).basis}): {values}{given}"
