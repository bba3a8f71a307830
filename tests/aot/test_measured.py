"""Measured update times beside the preflight's roofline (aot/measured.py, measured.json)."""

import json
import pathlib
import re

from transformer_jax.aot.measured import measured_line, measurements
from transformer_jax.model import TransformerConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
BASE = TransformerConfig.preset("base", vocab_size=32_000, dtype="bfloat16")
ENTRY = {"chip": "h100", "device": "NVIDIA H100 80GB HBM3", "num_layers": 6, "d_model": 512, "d_ff": 2048,
         "num_heads": 8, "vocab_size": 32000, "dtype": "bfloat16", "rows_per_device": 12, "width": 256,
         "ms_per_update": 15.0, "roofline_ms": 5.0, "date": "2026-11-26", "source": "results.txt", "what": "timed"}


def known(*entries):
    return measurements(json.dumps({"measurements": list(entries)}))


def test_a_measurement_at_the_same_batch_is_printed_with_its_ratio_to_this_roofline():
    line = measured_line("h100", BASE, 12, 256, roofline_ms=6.0, known=known(ENTRY))
    assert line.startswith("measured        15.0 ms per update on one NVIDIA H100 80GB HBM3, 2026-11-26 (results.txt)")
    assert "2.5x the roofline above" in line


def test_at_another_batch_the_nearest_measured_one_is_named_with_its_own_ratio():
    far = {**ENTRY, "rows_per_device": 96, "ms_per_update": 40.0, "roofline_ms": 20.0}
    line = measured_line("h100", BASE, 80, 256, roofline_ms=9.0, known=known(ENTRY, far))
    assert "not at this batch; 96 rows x 256 per device took 40.0 ms" in line and "2.0x its roofline of 20.0 ms" in line
    no_roofline = measured_line("h100", BASE, 48, 256, 9.0, known=known({**far, "roofline_ms": None}))
    assert "took 40.0 ms per update" in no_roofline and "its roofline" not in no_roofline


def test_another_chip_or_model_has_no_measured_line():
    assert measured_line("v5e", BASE, 12, 256, 6.0, known=known(ENTRY)) is None
    assert measured_line("h100", TransformerConfig.preset("big", vocab_size=32_000, dtype="bfloat16"), 12, 256, 6.0,
                         known=known(ENTRY)) is None
    assert measured_line("h100", TransformerConfig.preset("base", vocab_size=32_000), 12, 256, 6.0,
                         known=known(ENTRY)) is None  # float32 is another run


def test_every_shipped_measurement_is_in_the_raw_file_it_cites():
    """Each figure of measured.json appears (to its printed precision) in the results file it names."""
    shipped = measurements()
    assert {m.chip for m in shipped} >= {"h100"}
    for m in shipped:
        raw = (REPO / m.source).read_text()
        figures = [float(x) for x in re.findall(r"'ms_per_update': ([0-9.]+)", raw)]
        assert any(round(x, 2) == m.ms_per_update or round(x, 1) == m.ms_per_update for x in figures), m
