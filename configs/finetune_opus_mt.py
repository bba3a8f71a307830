"""Fine-tune an imported OPUS-MT (Hugging Face Marian) model on your own parallel text.

Command:  transformer-jax import --hf_dir=opus-mt-en-de --workdir=runs/opus_en_de
          transformer-jax train --config=finetune_opus_mt --workdir=runs/opus_tuned
              --config.training.init_from=runs/opus_en_de --config.data.path=DIR
          (in a checkout, python train.py --config=configs/finetune_opus_mt.py takes the same flags)
DIR holds train/dev/test.<lang> line-aligned files (data.source "text"). The model, its tokenizer and its
parameters come from training.init_from (docs/opus_mt.md); the settings below are the fine-tuning's own.
"""

from transformer_jax.config import default_config


def get_config():
    """A short fine-tuning schedule: warm-up to 5e-5, then the inverse square root, 10k updates."""
    config = default_config()
    config.data.source = "text"
    config.data.tokens_per_batch = 8_192
    config.data.max_length = 256

    training = config.training
    training.num_train_steps = 10_000
    training.warmup_steps = 500
    training.peak_learning_rate = 5e-5  # fine-tuning: far below the paper's peak for a model trained from scratch
    training.eval_every = 500
    training.bleu_every = 2_000
    training.dev_bleu_sentences = 500
    training.checkpoint_every = 500
    return config
