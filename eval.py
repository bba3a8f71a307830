"""Evaluate or use a trained run: the checkout's form of the `transformer-jax` commands score, translate,
average, export and plot, with eval.py's flags of old (each form names its command in one line on stderr).

  python eval.py --workdir=DIR [--checkpoint=latest|best|STEP|average:N] [--split=test|dev] [search flags]
  python eval.py --workdir=DIR --translate=FILE|-          # transformer-jax translate --input=FILE
  python eval.py --workdir=DIR --checkpoint=average:5 --write_averaged=PATH   # transformer-jax average --output
  python eval.py --workdir=DIR --export=ctranslate2:OUT    # transformer-jax export --format=... --output=OUT
  python eval.py --workdir=DIR --plot_curves --plot_positional_encoding --plot_attention=TEXT   # plot
"""

import sys

# The package's first line records SIGTERM/SIGINT during the imports (seconds): acted on when the command starts.
from transformer_jax.__main__ import run_subcommand
from transformer_jax.cli import eval_command

if __name__ == "__main__":
    run_subcommand(*eval_command(sys.argv))
