"""The paper's base model on WMT14 EN->DE (TFDS wmt14_translate/de-en, newstest2013 dev, newstest2014 test).

Command:  transformer-jax train --config=wmt14_ende_base --workdir=runs/base
          (in a checkout, the same: python train.py --config=configs/wmt14_ende_base.py --workdir=runs/base)
Hardware: the paper used 8 P100 GPUs for 100k steps (12 hours) with ~25k source + ~25k target
          tokens per step. On one GPU, keep the global batch with --config.training.accumulation_steps=8
          (and --config.data.tokens_per_batch=3125), or lower the batch and expect a lower BLEU.
Expected: paper, newstest2014: 27.3 tokenized BLEU (last 5 checkpoints averaged, beam 4, alpha 0.6).
          Not yet measured with this code.
Data:     prepare once with `python -c "import tensorflow_datasets as tfds; tfds.builder('wmt14_translate/de-en',
          file_format='array_record').download_and_prepare()"` (downloads ~1.5 GB; array_record lets it load
          without TensorFlow), then pass
          --config.data.tfds_data_dir if it is not in the TFDS default location.
"""

from transformer_jax.config import default_config


def get_config():
    """Base: N=6, d_model=512, d_ff=2048, h=8, dropout 0.1, 100k steps, warmup 4000."""
    config = default_config()
    config.model.dtype = "bfloat16"  # bfloat16 compute, float32 parameters and optimizer state
    return config
