"""Fine-tuning: a new run that starts from another run's parameters (`training.init_from`).

The run named by `training.init_from` (one train.py wrote, or one `python -m transformer_jax.cli.import_marian`
made from an OPUS-MT model) gives the new run its architecture (`adopt_initial_model`), its tokenizer (the
corpus is encoded with it: data/pipeline.py), and the parameters of its newest checkpoint, placed where the new
run's state keeps them (`initial_params`). Optimizer state and step start afresh; a resumed fine-tuning run
resumes from its own checkpoints, as any run does.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from transformer_jax.base import workdir as layout
from transformer_jax.config.schema import read_run_config
from transformer_jax.errors import ConfigError

# The model settings that make the parameters what they are: taken from the run started from. The rest (dropout,
# dtype, attention backend, remat, scanned layers) are the new run's own choice.
ARCHITECTURE = ("num_layers", "d_model", "d_ff", "num_heads", "max_len", "norm_position", "positional_encoding",
                "share_embeddings", "tie_output_embedding", "output_bias", "activation", "layer_norm_epsilon")


def adopt_initial_model(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
    """`config` with the architecture and vocabulary size of the run `training.init_from` names (unchanged
    without one); a ConfigError when that is not a run, or is `workdir` itself."""
    source = config.training.init_from
    if not source:
        return config
    if os.path.abspath(source) == os.path.abspath(workdir):
        raise ConfigError(f"training.init_from={source} is this run's own --workdir; name another run directory")
    if not os.path.isfile(layout.run_path(source, layout.CONFIG)):
        raise ConfigError(f"training.init_from={source} holds no run (no config.json); pass a directory train.py "
                          "or python -m transformer_jax.cli.import_marian wrote")
    from transformer_jax.data.tokenizer import Tokenizer

    started_from = read_run_config(layout.run_path(source, layout.CONFIG))
    config = config.copy_and_resolve_references()
    for key in ARCHITECTURE:
        config.model[key] = started_from.model[key]
    config.model.vocab_size = 0
    config.data.vocab_size = Tokenizer.load(layout.run_path(source, layout.TOKENIZER)).vocab_size
    return config


def initial_params(source: str, current: Any, scanned: bool) -> tuple[Any, int]:
    """The newest parameters of the run in `source`, laid out (`scanned` or not), boxed and placed as `current`
    (the new run's initial parameters); and the step they are from."""
    from transformer_jax.checkpoints.selection import checkpoint_params, open_run, select_steps
    from transformer_jax.model.stacks import scanned_layout

    run = open_run(source)
    steps = select_steps(run.checkpointer, "latest")
    params = checkpoint_params(run, steps)
    if scanned:
        params = scanned_layout(params)
    unboxed = nn.meta.unbox(current)
    if jax.tree.structure(unboxed) != jax.tree.structure(params):
        raise ConfigError(f"the parameters of {source} do not fit this run's model; start from a run of the same "
                          "architecture")
    placed = jax.tree.map(lambda now, value: jax.device_put(np.asarray(value, now.dtype), now.sharding),
                          unboxed, params)
    return nn.meta.replace_boxed(current, placed), steps[0]
