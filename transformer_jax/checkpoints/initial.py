"""Fine-tuning: a new run that starts from another run's parameters (`training.init_from`).

The run named by `training.init_from` (one train.py wrote, or one `python -m transformer_jax.cli.import_marian`
made from an OPUS-MT model) gives the new run its architecture (`adopt_initial_model`), its tokenizer (the
corpus is encoded with it: data/pipeline.py), and the parameters of its newest checkpoint, placed where the new
run's state keeps them (`initial_params`). Optimizer state and step start afresh; a resumed fine-tuning run
resumes from its own checkpoints, as any run does.
"""

from __future__ import annotations

import os
from typing import Any, Collection

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from transformer_jax.base import workdir as layout
from transformer_jax.base.console import say
from transformer_jax.config.schema import read_run_config
from transformer_jax.errors import CheckpointError, ConfigError, ShapeMismatchError

# The model settings that make the parameters what they are: taken from the run started from. The rest (dropout,
# dtype, attention backend, remat, scanned layers) are the new run's own choice.
ARCHITECTURE = ("num_layers", "d_model", "d_ff", "num_heads", "max_len", "norm_position", "positional_encoding",
                "share_embeddings", "tie_output_embedding", "output_bias", "activation", "layer_norm_epsilon")


def adopt_initial_model(config: ml_collections.ConfigDict, workdir: str,
                        explicit: Collection[str] = ()) -> ml_collections.ConfigDict:
    """`config` with the architecture and vocabulary size of the run `training.init_from` names (unchanged
    without one); a ConfigError when that is not a run, or is `workdir` itself.

    The source run fixes what a fine-tune cannot change (FIXED_BY_SOURCE). A setting among them given on the
    command line (`explicit`: keys such as "model.d_model") that differs from the source's is refused, naming
    each; the config file's own values are replaced, and a line names the ones that differed.
    """
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
    adopted = config.copy_and_resolve_references()
    for key in ARCHITECTURE:
        adopted.model[key] = started_from.model[key]
    adopted.model.vocab_size = 0
    adopted.data.vocab_size = Tokenizer.load(layout.run_path(source, layout.TOKENIZER)).vocab_size
    differ = [key for key in FIXED_BY_SOURCE if _value(config, key) != _value(adopted, key)
              and not (key == "model.vocab_size" and _value(config, key) in (0, adopted.data.vocab_size))]
    refused = [key for key in differ if key in explicit]
    if refused:
        given = ", ".join(f"--config.{key}={_value(config, key)!r}" for key in refused)
        theirs = ", ".join(f"{key}={_value(adopted, key)!r}" for key in refused)
        raise ConfigError(f"training.init_from={source} fixes the model and the vocabulary, so {given} cannot apply "
                          f"(that run has {theirs}); drop those flags, or train a new model without init_from")
    if differ:
        say(f"training.init_from={source}: its model replaces the config file's "
            + ", ".join(f"{key}={_value(config, key)!r} (now {_value(adopted, key)!r})" for key in differ))
    return adopted


# What a run started from another's parameters takes from it (the config's keys, "section.key").
FIXED_BY_SOURCE = (*(f"model.{key}" for key in ARCHITECTURE), "model.vocab_size", "data.vocab_size")


def _value(config: ml_collections.ConfigDict, key: str) -> Any:
    section, name = key.split(".")
    return config[section][name]


def initial_params(source: str, current: Any, scanned: bool) -> tuple[Any, int]:
    """The newest parameters of the run in `source`, laid out (`scanned` or not), boxed and placed as `current`
    (the new run's initial parameters); and the step they are from."""
    from transformer_jax.checkpoints.saved_run import open_run
    from transformer_jax.checkpoints.selection import checkpoint_params, select_steps
    from transformer_jax.model.stacks import scanned_layout

    try:
        run = open_run(source)
        steps = select_steps(run.checkpointer, "latest")
        params = checkpoint_params(run, steps)
    except ShapeMismatchError:
        raise
    except CheckpointError as error:  # its advice names eval's flags (--checkpoint, --workdir): train has neither
        problem = str(error).split("; ")[0]
        raise CheckpointError(f"training.init_from={source}: {problem}; a fine-tune starts from that run's newest "
                              "checkpoint, so set training.init_from to a run with an intact one") from None
    if scanned:
        params = scanned_layout(params)
    unboxed = nn.meta.unbox(current)
    if jax.tree.structure(unboxed) != jax.tree.structure(params):
        raise ConfigError(f"the parameters of {source} do not fit this run's model; start from a run of the same "
                          "architecture")
    placed = jax.tree.map(lambda now, value: jax.device_put(np.asarray(value, now.dtype), now.sharding),
                          unboxed, params)
    return nn.meta.replace_boxed(current, placed), steps[0]
