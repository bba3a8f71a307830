"""The paper's big model on WMT14 EN->DE.

Command:  transformer-jax train --config=wmt14_ende_big --workdir=runs/big
          (in a checkout, the same: python train.py --config=configs/wmt14_ende_big.py --workdir=runs/big)
Hardware: the paper used 8 P100 GPUs for 300k steps (3.5 days).
Expected: paper, newstest2014: 28.4 tokenized BLEU (last 20 checkpoints averaged). Not yet measured
          with this code.
"""

from transformer_jax.config import default_config


def get_config():
    """Big: d_model=1024, d_ff=4096, h=16, dropout 0.3, 300k steps; checkpoints every 10 min ~ 1k steps."""
    config = default_config()
    config.model.d_model = 1024
    config.model.d_ff = 4096
    config.model.num_heads = 16
    config.model.dropout_rate = 0.3
    config.model.dtype = "bfloat16"
    config.training.num_train_steps = 300_000
    config.training.keep_checkpoints = 20
    config.eval.average_last = 20  # the paper averages the last 20 checkpoints of big models
    return config
