"""Your own parallel text: a run sized from the corpus in one directory.

Command:  transformer-jax train --config=parallel_text:DIR,SRC,TGT --workdir=runs/mine
          e.g. --config=parallel_text:data/my_corpus,en,de  [--config.KEY=VALUE ...]
          (in a checkout, the same: python train.py --config=configs/parallel_text.py:DIR,SRC,TGT ...)
Layouts:  DIR/train.SRC + DIR/train.TGT (line-aligned), dev.* (or fairseq's valid.*), test.* optional;
          or DIR/train.tsv, dev.tsv, test.tsv with a header line naming the columns (`en<TAB>de`) or
          --config.data.tsv_columns=SOURCE,TARGET. Without a test split the final scores are dev's (labelled so).
Hardware: chosen by corpus size (transformer_jax/config/parallel_text.py): under 20k pairs a model that trains
          in minutes on a CPU; up to 500k an IWSLT-sized model; up to 10M the paper's base; above, big (GPUs/TPUs).
Expected: one line at start naming the tier, model, vocabulary, batch and steps chosen (after your overrides);
          a test (or dev) SacreBLEU printed at the end; the chosen sizes are in <workdir>/config.json.
Overrides: the steps follow data.tokens_per_batch, and the warm-up, logs and checkpoints follow the steps, so
          --config.training.num_train_steps=600 shortens the warm-up with it; a warm-up you set longer than the
          run is refused.
"""

from transformer_jax.config import parallel_text_config
from transformer_jax.errors import ConfigError


def get_config(arguments: str = ""):
    """`arguments`: DIR,SRC,TGT (the corpus directory and the two language codes of its file names)."""
    parts = arguments.split(",")
    if len(parts) != 3 or not all(part.strip() for part in parts):
        raise ConfigError(f"configs/parallel_text.py needs DIR,SRC,TGT after a colon, not {arguments!r}: "
                          "--config=configs/parallel_text.py:data/my_corpus,en,de")
    return parallel_text_config(*(part.strip() for part in parts))
