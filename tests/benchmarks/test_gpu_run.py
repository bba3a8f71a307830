"""The lease run (benchmarks/lease/gpu_run.py): its flags and --out check, and what train.py and eval.py
recorded, read back into the tables (benchmarks/lease/records.py)."""

import json

import pytest

from benchmarks.lease.gpu_run import (BACKEND_FLAG, OutNotEmpty, check_out, gpu_kind, main, main_backend,
                                      write_test_sources)
from benchmarks.lease.records import (backend_table, compile_seconds, error_line, finite_training, predicted, table,
                                      window_figures)


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
    records += [{"step": 125, "checkpoint_write_seconds": 0.5}, {"step": 125, "stop_estimate_seconds": 0.52},
                {"step": 127, "stop_seconds": 0.6, "signal_step": 126}]
    figures = window_figures(records)
    assert figures["windows"] == 2 and figures["last_step"] == 125
    assert figures["stop"] == {"step": 127, "stop_seconds": 0.6, "signal_step": 126}
    assert figures["stop_estimate_seconds"] == 0.52
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
               "train": {**phase, "stop": {"step": 401, "stop_seconds": 2.5, "signal_step": 400},
                         "stop_estimate_seconds": 3.25, "lead_wait_seconds_per_update": 0.009},
               "resume": {**phase, "last_step": 600, "stop": {"step": 650, "stop_seconds": 1.04, "signal_step": 601}},
               "gpu_memory_peak_mb": 3000.0,
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
    assert ("| SIGTERM to checkpoint on disk: K=2 (train) / no bound (resume) | 2.5 s (signal at step 400, checkpoint "
            "401) / 1.0 s (signal at step 601, checkpoint 650) |") in text
    assert "| the run's stop estimate (K=2, its first checkpoint write) | 3.2 s |" in text
    assert ("| host ms per update: input / dispatch / bound's wait (K=2) / window's wait | 1.00 / 2.00 / 9.00 / "
            "11.00 |") in text
    assert "| resume with no bound (K=1000): updates, tokens/s | to step 600, 150,000 |" in text


def test_a_non_empty_out_is_refused_in_one_line_before_anything_runs(tmp_path, capsys):
    check_out(str(tmp_path / "new"))
    check_out(str(tmp_path))  # empty: fine
    (tmp_path / "train.log").write_text("a previous call\n")
    with pytest.raises(OutNotEmpty, match="is not empty"):
        check_out(str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--lease", str(tmp_path / "lease"), "--out", str(tmp_path), "--config.model.dtype=float32"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --out {tmp_path} is not empty")


def test_extra_flags_are_config_flags_and_choose_the_main_runs_backend(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--out", "x", "--learning_rate=1"])
    assert "unrecognized arguments: --learning_rate=1" in capsys.readouterr().err
    assert main_backend([]) == "auto"
    assert main_backend(["--config.model.dtype=bfloat16", f"{BACKEND_FLAG}fused"]) == "fused"
    assert gpu_kind("NVIDIA H200", False) == "h200" and gpu_kind("NVIDIA H100 80GB HBM3", False) == "h100"
    assert gpu_kind("cpu", True) == "h200"


def test_a_backends_run_is_finite_or_not_and_a_failure_is_its_error_line(tmp_path):
    run = tmp_path / "backend-cudnn"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 50, "split": "train", "loss": 7.5, "grad_norm": 1.0},
        {"step": 50, "split": "dev", "loss": 7.0},
        {"step": 100, "split": "train", "loss": float("nan"), "grad_norm": float("nan")})))
    assert finite_training(str(run)) == {"logged": 2, "finite": False, "non_finite": 1, "last_loss": pytest.approx(
        float("nan"), nan_ok=True)}
    assert finite_training(str(tmp_path / "none"))["finite"] is False
    log = tmp_path / "backend-cudnn.log"
    log.write_text("I1128 compiling\rprogress 3/10\nerror: train_step failed on the device (cudnn attention); "
                   "try --config.model.attention_backend=fused\nW1128 exiting\n")
    assert error_line(str(log)).startswith("error: train_step failed on the device")
    profile = {"device": "gpu", "busy": 0.02, "kernels": 1480.0, "launch": 0.031}
    text = backend_table({
        "fused": {"exit": 143, "last_step": 400, "finite": True, "logged": 8, "tokens_per_second": 650000.0,
                  "seconds_per_update": 0.0356, "trace": profile},
        "cudnn": {"exit": 1, "last_step": 0, "finite": False, "logged": 0, "error": error_line(str(log))},
        "einsum": {"skipped": "out of the call's time"}})
    assert "| fused | 143 | 400 | yes (8 logged) | 650,000 | 35.60 | 20.00 | 1,480 | 31.00 |  |" in text
    assert "| cudnn | 1 | 0 | NO (0 logged) | - | - | - | - | - | error: train_step failed on the device" in text
    assert "| einsum | - | - | - | - | - | - | - | - | not run: out of the call's time |" in text
    cpu = backend_table({"einsum": {"exit": 0, "finite": True, "logged": 2, "trace": {"device": "host", "busy": 1}}})
    assert "| - | - | - | profile: no device tracks |" in cpu  # a CPU's host ops are not device figures


def test_the_table_names_the_phases_left_out():
    summary = {"device": "NVIDIA H200", "versions": {"platform": "gpu", "jax": "0.11.2"}, "rehearsal": False,
               "train": {"first_update_s": 60.0, "exit": 143, "last_step": 2000, "windows": 30},
               "skipped": ["eval", "translate"], "extra_flags": ["--config.model.attention_backend=fused"],
               "prediction": {"kind": "h200"}}
    text = table(summary)
    assert "| phases not run (out of the call's time) | eval, translate |" in text
    assert "| extra flags | --config.model.attention_backend=fused |" in text
    assert "| eval.py test split: wall / compile / exit | - / 0.0 s / - |" in text


def test_the_lease_scripts_inputs_are_checked_first_and_a_refusal_leaves_nothing(tmp_path, capsys):
    """A missing lease folder, an unknown backend, a --text folder that is missing or holds no training text: one
    line each, exit 2, before any phase runs; --out stays absent, so the corrected command is not refused."""
    lease, out, text = tmp_path / "lease", tmp_path / "out", tmp_path / "text"

    def refused(argv: list[str], fragment: str) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err

    refused(["run", "--lease", str(lease), "--out", str(out), "--rehearse"], "holds no prepared corpus")
    refused(["prepare", "--text", str(text), "--out", str(lease)], "is not a folder")
    text.mkdir()
    (text / "train.en").write_text("a\n")
    refused(["prepare", "--text", str(text), "--out", str(lease)], "has no train.de")
    (lease / "corpus").mkdir(parents=True)
    (lease / "corpus" / "manifest.json").write_text("{}")
    refused(["run", "--lease", str(lease), "--out", str(out), "--backends", "fused,flash"],
            "--backends names flash, not attention backends; choose among auto,fused,cudnn,einsum")
    assert not out.exists() and sorted(p.name for p in lease.rglob("*")) == ["corpus", "manifest.json"]
