"""The lease run's readers (benchmarks/gpu_run.py): what train.py and eval.py recorded, read back into the table."""

import json

import pytest

from benchmarks.gpu_run import compile_seconds, predicted, table, write_test_sources, window_figures


def test_window_figures_take_medians_per_update_and_leave_out_the_first_window():
    records = [
        {"step": 0, "startup_seconds": 30.0, "restore_seconds": 0.0, "compile_seconds": 20.0},
        {"step": 50, "tokens_per_second": 1.0, "seconds_per_step": 9.0, "input_seconds": 50.0, "dispatch_seconds": 50.0,
         "sync_seconds": 0.0, "host_share": 1.0},  # the first window: compiling's tail, left out
        {"step": 100, "tokens_per_second": 100.0, "seconds_per_step": 0.02, "input_seconds": 0.05,
         "dispatch_seconds": 0.1, "sync_seconds": 0.5, "host_share": 0.5},
        {"step": 100, "checkpoint_stall_seconds": 0.25},
        {"step": 100, "eval_seconds": 1.5},
        {"step": 125, "tokens_per_second": 200.0, "seconds_per_step": 0.01, "input_seconds": 0.025,
         "dispatch_seconds": 0.05, "sync_seconds": 0.0, "host_share": 0.9},
    ]
    figures = window_figures(records)
    assert figures["windows"] == 2 and figures["last_step"] == 125
    assert figures["tokens_per_second"] == 200.0 and figures["host_share"] == 0.9  # the upper median of two
    assert figures["input_seconds_per_update"] == pytest.approx(0.001)  # 0.05 / 50 and 0.025 / 25
    assert figures["sync_seconds_per_update"] == pytest.approx(0.01)  # 0.5 / 50 (0 / 25 is the lower)
    assert figures["checkpoint_stalls"] == [0.25] and figures["eval_seconds"] == [1.5]
    assert figures["start"]["startup_seconds"] == 30.0


def test_compile_times_come_from_jax_compile_log_and_the_prediction_from_the_preflight(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("W1127 dispatch.py:204] Finished XLA compilation of jit(train_step) in 31.5 sec\n"
                   "progress\rW1127 dispatch.py:204] Finished XLA compilation of jit(train_step) in 2.5 sec\n"
                   "W1127 dispatch.py:204] Finished XLA compilation of jit(less) in 0.01 sec\n")
    assert compile_seconds(str(log)) == {"jit(train_step)": 34.0, "jit(less)": 0.01}
    (tmp_path / "prediction-h100.txt").write_text(
        "batch           12 rows x 128 tokens per micro-step\n"
        "memory          peak 2.39 GB per GPU of 80.00 GB HBM (3%): fits\n"
        "predicted       5.4 ms per update, 565,168 target tokens/s (roofline ...)\n")
    assert predicted(str(tmp_path), "h100") == {"ms_per_update": 5.4, "peak_gb": 2.39, "width": 128.0}
    assert predicted(str(tmp_path), "h200") == {}


def test_the_table_shows_each_phase_and_sources_are_the_test_split(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "test.json").write_text(json.dumps([["a b", "x"], ["c", "y"], ["d e f", "z"]]))
    assert write_test_sources(str(tmp_path), str(tmp_path / "src.txt"), 2) == 2
    assert (tmp_path / "src.txt").read_text() == "a b\nc\n"
    phase = {"first_update_s": 12.0, "stop_s": 3.0, "exit": 0, "last_step": 400, "windows": 7,
             "tokens_per_second": 150000.0, "seconds_per_update": 0.016, "mfu": 0.21, "host_share": 0.3,
             "input_seconds_per_update": 0.001, "dispatch_seconds_per_update": 0.002,
             "sync_seconds_per_update": 0.011, "checkpoint_stalls": [0.4], "eval_seconds": [2.0],
             "start": {"startup_seconds": 20.0, "restore_seconds": 2.0, "compile_seconds": 9.0}}
    summary = {"device": "NVIDIA H100 80GB HBM3", "versions": {"platform": "gpu", "jax": "0.11.2"}, "rehearsal": False,
               "train": phase, "resume": {**phase, "last_step": 600}, "gpu_memory_peak_mb": 3000.0,
               "eval": {"wall_s": 40.0, "exit": 0, "bleu": 31.25, "sentences": 1000},
               "translate": {"wall_s": 20.0, "exit": 0, "lines": 500},
               "compile_seconds": {"train": {"jit(train_step)": 30.0}, "resume": {}, "eval": {"jit(search)": 20.0},
                                   "translate": {}},
               "prediction": {"kind": "h100", "ms_per_update": 5.4, "peak_gb": 2.39}}
    text = table(summary)
    assert "| ms per update (median window) | 16.00 |" in text
    assert "| preflight's prediction, ms per update | 5.40 (h100 roofline) |" in text
    assert "| MFU of real target tokens | 21.0% (FLOPs per token at rows 256 wide" in text
    assert "| eval sentences/s (wall; without compile) | 25.0; 50.0 |" in text
    assert "| test SacreBLEU of the short run | 31.25 |" in text
    assert "| resume: start-up / restore / compile | 20.0 s / 2.0 s / 9.0 s |" in text
