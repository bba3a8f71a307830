"""The models the sections time, and their run built by the run builder on one device, as train.py builds it."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from transformer_jax import TransformerConfig
from transformer_jax.base import make_mesh
from transformer_jax.config import default_config
from transformer_jax.run import RunPrograms, build_run

SMALL = TransformerConfig(vocab_size=4000, num_layers=2, d_model=128, d_ff=512, num_heads=4, max_len=256)
BASE = TransformerConfig(vocab_size=37000)  # the paper's base model: N=6, d_model=512, d_ff=2048, h=8
SHORT_SENTENCES = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256, d_ff=1024, num_heads=4, max_len=256)


def on_gpu() -> bool:
    """Whether JAX's default device is a GPU (the sections then time bfloat16 models at the paper's batch)."""
    return jax.devices()[0].platform == "gpu"


def run_config(model: TransformerConfig) -> ml_collections.ConfigDict:
    """The default run config (the paper's Adam, schedule and label smoothing 0.1) with `model`.

    The sections feed their own batches, so data.max_length only has to pass the run's check against the
    model's positions: it is set to the longest the model accepts.
    """
    config = default_config()
    config.model.update(dataclasses.asdict(model))
    config.data.max_length = model.max_len - 1
    return config


def one_device_run(model: TransformerConfig) -> RunPrograms:
    """The run builder's programs of `model` on the first device (no batch shapes: jit compiles what it is fed)."""
    return build_run(run_config(model), make_mesh(devices=jax.devices()[:1]), model.vocab_size)
