"""The full set of run settings with their defaults; the files in configs/ override them.

Every key is documented here: by the comment beside its assignment (or the lines just above it),
and model keys by TransformerConfig's docstring. The README's configuration reference is generated
from these (`python -m transformer_jax.config_reference`) and a test fails when the two differ.
Overriding a key that does not exist fails at start-up.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from transformer_jax.config import TransformerConfig


def default_config() -> ml_collections.ConfigDict:
    """The paper's base model and schedule on TFDS WMT14 EN->DE."""
    config = ml_collections.ConfigDict()

    # model: every field of TransformerConfig (see transformer_jax/config.py for their meaning).
    config.model = ml_collections.ConfigDict(dataclasses.asdict(TransformerConfig.preset("base")))
    # 0 takes the tokenizer's size; any other value must equal it.
    config.model.vocab_size = 0

    config.data = data = ml_collections.ConfigDict()
    data.source = "tfds"  # "builtin" | "tfds" | "text" | "tsv"
    data.path = ""  # directory with train/dev/test files for "text" and "tsv"
    data.source_lang = "en"  # translation direction: source language
    data.target_lang = "de"  # translation direction: target language
    data.tfds_train_name = "wmt14_translate/de-en"  # TFDS builder of the training split
    data.tfds_eval_name = "wmt14_translate/de-en"  # TFDS builder of dev (newstest2013) and test (newstest2014)
    data.tfds_data_dir = ""  # TFDS data_dir ("" = TFDS default)
    data.tfds_manual_dir = ""  # TFDS manual_dir for builders that need manual downloads
    data.builtin_train_size = 50_000  # built-in corpus: training pairs
    data.builtin_dev_size = 1_000  # built-in corpus: dev pairs
    data.builtin_test_size = 2_000  # built-in corpus: test pairs
    data.vocab_size = 32_000  # SentencePiece vocabulary size (joint source/target)
    data.tokenizer_type = "unigram"  # SentencePiece model: "unigram" | "bpe"
    data.byte_fallback = True  # unknown characters become byte pieces instead of <unk>
    data.tokenizer_sample_size = 1_000_000  # sentences sampled across the corpus to train SentencePiece
    data.tokens_per_batch = 25_000  # padded token budget per batch and side (source or target)
    data.max_length = 256  # longest training pair in tokens (dev/test are never filtered)
    data.pack = True  # pack several pairs per row (segment ids); False: length buckets (more shapes, more padding)
    data.eval_batch_size = 64  # sentences per dev/test batch (rows, padded)

    config.training = training = ml_collections.ConfigDict()
    training.num_train_steps = 100_000  # optimizer updates
    training.warmup_steps = 4_000  # linear warm-up of the paper's schedule
    training.learning_rate_scale = 1.0  # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    training.adam_b1 = 0.9  # Adam beta1 (paper section 5.3)
    training.adam_b2 = 0.98  # Adam beta2
    training.adam_eps = 1e-9  # Adam epsilon
    training.label_smoothing = 0.1  # epsilon_ls of the label-smoothed cross-entropy (paper section 5.4)
    training.grad_clip_norm = 0.0  # global-norm clipping; 0 disables it
    training.accumulation_steps = 1  # micro-batches per update (to reach the paper's batch on fewer devices)
    training.seed = 0  # parameters, dropout and data order
    training.log_every = 100  # steps between training-metric logs
    training.eval_every = 1_000  # steps between dev-loss evaluations
    training.bleu_every = 5_000  # steps between dev-BLEU evaluations (0 = never during training)
    training.dev_bleu_sentences = 0  # dev sentences translated for dev BLEU (0 = all)
    training.checkpoint_every = 1_000  # steps between checkpoints (and one at the end)
    training.keep_checkpoints = 5  # newest checkpoints kept on disk (the best one is kept as well)
    training.max_skipped_updates = 20  # stop after this many consecutive non-finite updates

    config.mesh = mesh = ml_collections.ConfigDict()
    mesh.data = -1  # data-parallel axis size (-1 = all devices not used by fsdp)
    mesh.fsdp = 1  # fully sharded data-parallel axis size (parameters sharded over it)

    config.eval = evaluation = ml_collections.ConfigDict()
    evaluation.beam_size = 4  # beam search width for test translation and eval.py (paper section 6.1)
    evaluation.alpha = 0.6  # length penalty ((5 + len) / 6)^alpha
    evaluation.max_extra_length = 50  # output length limit: input length + this
    evaluation.average_last = 5  # checkpoints averaged by eval.py --checkpoint=average (paper: 5 base, 20 big)
    return config
