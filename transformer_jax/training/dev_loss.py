"""Loss, perplexity and token accuracy of a model over a whole dev/test split, on one device or a mesh.

The split is read in packed batches: padding weighs nothing in the loss and segment ids keep each
pair's attention inside the pair, so packing changes no loss value (up to float rounding); it only
drops the work on padding. The width comes from the split, not from data.max_length: its longest pair
rounded up to a multiple of 8, or the training row width when some pair is longer than that (those
pairs then go to rows of their own, as wide as the longest, as in training; dev/test are never
filtered). At most two shapes, each compiled once for the whole run.

The Trainer's periodic dev loss and the score command both sum a split here, with the same jitted step
(`dev_loss_step`). It reads the data pipeline's corpora, so, unlike the rest of `training/`, it needs the
`train` extra; `training/__init__.py` does not import it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.base.sharding import place_rows
from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.data.epoch_plan import Batch, materialize, plan_packed
from transformer_jax.data.shapes import BATCH_KEYS, loss_widths, round_rows
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import PAD_ID
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.step import eval_step


def loss_batches(corpus: EncodedPairs, rows: int, row_width: int | None = None, row_multiple: int = 1) -> list[Batch]:
    """Every pair of a dev/test split once, packed first-fit into batches of `rows` rows of `loss_widths`,
    then padded with all-PAD rows to a multiple of `row_multiple` (e.g. the mesh size).

    The order of the pairs is a fixed shuffle (the sums do not depend on it), so the batches are the same
    at every evaluation.
    """
    if len(corpus) == 0:
        return []
    longest = int(max(corpus.source.lengths.max(), corpus.target.lengths.max()))
    width, long_width = loss_widths(longest, row_width)
    plan = plan_packed(corpus, np.random.default_rng(0), {width: rows, long_width or width: rows}, width,
                       long_length=long_width)
    # All-PAD rows (segment 0, position 0: weighing nothing) up to the multiple: every mesh sums the same batches.
    padding = ((0, round_rows(rows, row_multiple) - rows), (0, 0))
    return [{key: np.pad(value, padding, constant_values=PAD_ID if key in BATCH_KEYS else 0)
             for key, value in materialize(corpus, plan, position, packed=True).items()}
            for position in range(len(plan))]


@functools.lru_cache(maxsize=8)
def dev_loss_step(model_config: TransformerConfig, smoothing: float, mesh: Mesh | None = None) -> Callable:
    """The jitted dev-loss step `(params, packed batch) -> metric sums per row`, one per (model, smoothing, mesh).

    Laid out by its arguments: params with the state's shardings and a batch split over the batch axes
    (evaluate_loss with the mesh) make each device compute its own rows. No in_shardings, so whole NumPy
    batches on one device work too. With `mesh`, every process gets every row's sums (an all-gather, which adds
    nothing: evaluate_loss adds the rows in order, so the totals do not depend on the mesh).
    """
    apply = Transformer(model_config).apply
    replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    return jax.jit(lambda params, batch: eval_step(params, apply, batch, smoothing), out_shardings=replicated)


def evaluate_loss(step_fn: Callable, params: Any, split: EncodedPairs, batch_size: int,
                  mesh: Mesh | None = None, row_width: int | None = None,
                  interrupt: Callable[[], None] | None = None) -> dict[str, float]:
    """Token-weighted loss, NLL, perplexity and accuracy of `params` over every pair of `split`.

    `step_fn(params, batch)` returns a batch's metrics summed per row (training/step.py's eval_step) or in all.
    The pairs are packed into batches of `batch_size` rows as wide as the split needs (`loss_batches`;
    `row_width`: the training row width).
    With `mesh`, each batch's rows (padded to a multiple of the mesh size with all-PAD rows, which
    weigh nothing) are split over its batch axes, so each device computes different rows; `params`
    must be laid out on the same mesh. `interrupt`, called before each batch, abandons the evaluation by raising
    (a training run's stop).
    """
    row_multiple = 1 if mesh is None else mesh.size
    batch_sums = []
    for batch in loss_batches(split, batch_size, row_width, row_multiple):
        if interrupt is not None:
            interrupt()
        # Dispatched without waiting: the next batch is prepared while the devices compute this one.
        batch_sums.append(step_fn(params, batch if mesh is None else place_rows(batch, mesh)))
    # Each batch's sums per row (or one sum), added on the host in float64 in row order: the same totals on any mesh.
    totals: dict[str, float] = {}
    for sums in jax.device_get(batch_sums):
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(np.sum(np.asarray(value, np.float64)))
    tokens = max(totals.get("tokens", 0.0), 1.0)
    nll = totals.get("nll", 0.0) / tokens
    return {
        "loss": totals.get("loss", 0.0) / tokens,
        "nll": nll,
        "perplexity": float(np.exp(min(nll, 50.0))),
        "accuracy": totals.get("correct", 0.0) / tokens,
    }
