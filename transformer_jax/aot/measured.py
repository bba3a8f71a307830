"""Update times measured on real chips, beside the preflight's roofline for the same run.

The roofline (aot/report.py) is a lower bound: it leaves out kernel launches, host work and the input.
Where a chip has run the same model, `measured.json` beside this module holds what it took: the
preflight prints that figure and its ratio to the roofline, at the same batch when there is one, else at
the batch that was timed (whose roofline the entry keeps). A new measurement is a new entry there; the
lease script (benchmarks/lease/gpu_run.py) prints the entry of its own run.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json

from transformer_jax.model.config import TransformerConfig

# What makes two runs the same model for a measured time.
MODEL_KEYS = ("num_layers", "d_model", "d_ff", "num_heads", "vocab_size", "dtype")


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One measured update time (see measured.json's "about")."""

    chip: str
    device: str
    num_layers: int
    d_model: int
    d_ff: int
    num_heads: int
    vocab_size: int
    dtype: str
    rows_per_device: int
    width: int
    ms_per_update: float
    roofline_ms: float | None
    date: str
    source: str
    what: str


def measurements(text: str | None = None) -> list[Measurement]:
    """The measurements in `text` (JSON as measured.json holds it; default that file)."""
    if text is None:
        text = importlib.resources.files("transformer_jax.aot").joinpath("measured.json").read_text()
    return [Measurement(**entry) for entry in json.loads(text)["measurements"]]


def measured_line(chip: str, model: TransformerConfig, rows_per_device: float, width: int, roofline_ms: float,
                  known: list[Measurement] | None = None) -> str | None:
    """The preflight's `measured` line for a run of `model` at `rows_per_device` rows of `width` on `chip`, whose
    roofline is `roofline_ms`; None when that chip has not run that model."""
    same = [m for m in (measurements() if known is None else known)
            if m.chip == chip and all(getattr(m, key) == getattr(model, key) for key in MODEL_KEYS)]
    if not same:
        return None
    exact = [m for m in same if m.rows_per_device == rows_per_device and m.width == width]
    if exact:
        m = exact[-1]
        return (f"measured        {m.ms_per_update:.1f} ms per update on one {m.device}, {m.date} ({m.source}): "
                f"{m.ms_per_update / roofline_ms:.1f}x the roofline above; {m.what}")
    m = min(same, key=lambda m: abs(m.rows_per_device - rows_per_device))
    ratio = f", {m.ms_per_update / m.roofline_ms:.1f}x its roofline of {m.roofline_ms:.1f} ms" if m.roofline_ms else ""
    return (f"measured        not at this batch; {m.rows_per_device} rows x {m.width} per device took "
            f"{m.ms_per_update:.1f} ms per update on one {m.device}{ratio}, {m.date} ({m.source})")
