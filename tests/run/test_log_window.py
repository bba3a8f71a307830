"""The log window: token-weighted summaries, throughput, and the lines written when a window closes."""

import json
import time

import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.run.log_window import (
    LogWindow,
    summarize_window,
    window_timing,
)


def step_metrics(loss, tokens, skipped=0):
    return {"loss": loss, "nll": loss / 2, "accuracy": 0.5, "tokens": tokens, "grad_norm": loss * 10,
            "update_skipped": skipped}


def test_summary_weights_steps_by_their_tokens():
    summary = summarize_window([step_metrics(1.0, 30.0), step_metrics(3.0, 10.0, skipped=1)])
    assert summary["loss"] == pytest.approx(1.5) and summary["nll"] == pytest.approx(0.75)
    assert summary["perplexity"] == pytest.approx(np.exp(0.75))
    assert summary["grad_norm"] == pytest.approx(20.0)  # a plain mean: every step has one norm
    assert summary["skipped_updates"] == 1.0


def test_timing_counts_tokens_per_wall_clock_second():
    timing = window_timing([step_metrics(1.0, 30.0), step_metrics(1.0, 10.0)], seconds=4.0)
    assert timing == {"tokens_per_second": 10.0, "seconds_per_step": 2.0}


def test_timing_says_how_much_of_the_window_the_host_was_busy():
    """The wait for the device at the window's close is the host's idle time: 1 s of 4 leaves a share of 0.75."""
    host = {"input_seconds": 0.5, "dispatch_seconds": 1.5}
    timing = window_timing([step_metrics(1.0, 30.0), step_metrics(1.0, 10.0)], 4.0, host, sync_seconds=1.0)
    assert timing == {"tokens_per_second": 10.0, "seconds_per_step": 2.0, "input_seconds": 0.5,
                      "dispatch_seconds": 1.5, "sync_seconds": 1.0, "host_share": 0.75}
    assert window_timing([step_metrics(1.0, 30.0)], 4.0, host, sync_seconds=0.0)["host_share"] == 1.0


def test_closing_a_resumed_window_logs_it_like_a_live_one(tmp_path):
    """A window restored from a checkpoint (Python floats) gives the same line as one of device values."""
    schedule = lambda count: 0.001 * (count + 1)
    live_metrics = [{k: jnp.float32(v) for k, v in step_metrics(loss, 7.0).items()} for loss in (1.0, 2.0)]
    restored = [{k: float(v) for k, v in m.items()} for m in live_metrics[:1]]
    lines = []
    for name, open_window, added in (("live", [], live_metrics), ("resumed", restored, live_metrics[1:])):
        (tmp_path / name).mkdir()
        window = LogWindow(str(tmp_path / name), schedule, 0, 2, open_window, enabled=True)
        for metrics in added:
            window.add(metrics)
        window.close(2, jnp.int32(1))
        assert window.step_metrics == []
        window.finish()
        lines.append((tmp_path / name / "metrics.jsonl").read_text())
        timing = json.loads((tmp_path / name / "timing.jsonl").read_text())
        assert timing["step"] == 2 and abs(timing["time"] - time.time()) < 60  # the clock, to read progress by
    assert lines[0] == lines[1]
    record = json.loads(lines[0])
    assert record["step"] == 2 and record["split"] == "train" and record["loss"] == pytest.approx(1.5)
    assert record["learning_rate"] == pytest.approx(0.001)  # one of two updates skipped: schedule(0)
