"""Loss, perplexity and token accuracy of a model over a whole dev/test split."""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from transformer_jax.data.batching import eval_batches
from transformer_jax.data.encoded import EncodedPairs


def evaluate_loss(step_fn: Callable, params: Any, split: EncodedPairs, batch_size: int) -> dict[str, float]:
    """Token-weighted loss, NLL, perplexity and accuracy of `params` over every pair of `split`."""
    totals: dict[str, float] = {}
    for batch in eval_batches(split, batch_size):
        sums = jax.device_get(step_fn(params, {k: v for k, v in batch.items() if k != "index"}))
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
