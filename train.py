"""Train a Transformer: python train.py --config=configs/demo.py --workdir=runs/demo [--config.KEY=VALUE ...].

The checkout's form of `transformer-jax train` (transformer_jax/cli/train.py), with the same flags: resumes
from the newest checkpoint in --workdir; at the end translates the test split with beam search and prints
SacreBLEU (the signature included).
"""

# The package's first line records SIGTERM/SIGINT during the imports (seconds): acted on when the command starts.
from transformer_jax.__main__ import run_subcommand

if __name__ == "__main__":
    run_subcommand("train")
