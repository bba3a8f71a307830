"""Train a Transformer: python train.py --config=configs/demo.py --workdir=runs/demo [--config.KEY=VALUE ...].

The checkout's form of `transformer-jax train` (transformer_jax/cli/train.py), with the same flags: resumes
from the newest checkpoint in --workdir; at the end translates the test split with beam search and prints
SacreBLEU (the signature included).
"""

import signal

ARRIVED: list[int] = []  # SIGTERM/SIGINT during the imports below (seconds), acted on when the command starts
for _stop in (signal.SIGTERM, signal.SIGINT):
    if signal.getsignal(_stop) is not signal.SIG_IGN:  # a background job's ignored SIGINT stays ignored
        signal.signal(_stop, lambda number, frame: ARRIVED.append(number))


from transformer_jax.__main__ import run_subcommand  # noqa: E402

if __name__ == "__main__":
    run_subcommand("train", arrived=ARRIVED)
