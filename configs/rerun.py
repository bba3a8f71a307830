"""Rerun a run's saved settings: the config.json a training run wrote, as a config.

Command:  transformer-jax train --config=rerun:runs/demo/config.json --workdir=runs/demo_again
          [--config.KEY=VALUE ...]   (in a checkout: python train.py --config=configs/rerun.py:FILE ...)
Hardware: whatever the saved run needed.
Expected: the same run as the one that wrote the file (resumed, when --workdir is that run's).
A key the schema does not know, a setting the file lacks, or a damaged file, is one error line naming the file.
"""

from transformer_jax.config import read_run_config


def get_config(config_json: str):
    """The full run config with every value saved in `config_json` (a run's `<workdir>/config.json`)."""
    return read_run_config(config_json, complete=True)
