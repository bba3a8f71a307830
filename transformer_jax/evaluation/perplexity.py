"""Loss, perplexity and token accuracy of a model over a whole dev/test split, on one device or a mesh."""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh

from transformer_jax.data.batching import eval_batches
from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.run.sharding import batch_sharding


def place_rows(batch: Any, mesh: Mesh) -> Any:
    """A batch (an array or a tree of arrays) every process holds whole, its rows split over the mesh.

    Each device copies only its own block of rows; unlike `device_put`, this also works when the
    mesh spans several processes.
    """
    sharding = batch_sharding(mesh)
    return jax.tree.map(
        lambda value: jax.make_array_from_callback(value.shape, sharding, lambda index: value[index]), batch)


def evaluate_loss(step_fn: Callable, params: Any, split: EncodedPairs, batch_size: int,
                  mesh: Mesh | None = None) -> dict[str, float]:
    """Token-weighted loss, NLL, perplexity and accuracy of `params` over every pair of `split`.

    `step_fn(params, batch)` returns a batch's summed metrics. With `mesh`, each batch's rows (padded
    to a multiple of the mesh size with all-PAD rows, which weigh nothing) are split over its batch
    axes, so each device computes different sentences; `params` must be laid out on the same mesh.
    """
    row_multiple = 1 if mesh is None else mesh.size
    batch_sums = []
    for batch in eval_batches(split, batch_size, row_multiple=row_multiple):
        inputs = {key: value for key, value in batch.items() if key != "index"}
        # Dispatched without waiting: the next batch is prepared while the devices compute this one.
        batch_sums.append(step_fn(params, inputs if mesh is None else place_rows(inputs, mesh)))
    totals: dict[str, float] = {}
    for sums in jax.device_get(batch_sums):
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    tokens = max(totals.get("tokens", 0.0), 1.0)
    nll = totals.get("nll", 0.0) / tokens
    return {
        "loss": totals.get("loss", 0.0) / tokens,
        "nll": nll,
        "perplexity": float(np.exp(min(nll, 50.0))),
        "accuracy": totals.get("correct", 0.0) / tokens,
    }
