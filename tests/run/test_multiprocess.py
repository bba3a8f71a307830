"""Several hosts on one machine: 2 JAX processes (2 CPU devices each) train like 1 process with 4 devices.

Every run is train.py itself under JAX's multi-controller runtime (jax.distributed, gloo collectives on
CPU), started through tests/record_batches.py, which records what each process reads and logs.
The single-process reference joins the same runtime alone (`--multihost --num_processes=1`), so
its cross-device sums go through the same collectives and the comparison can be exact.
"""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from runs import (NO_TEST_TRANSLATION, finish_all, free_port, script_env, snapshot, start_script, tiny_run_config,
                  write_config)
from transformer_jax.checkpoints.manager import Checkpointer
from transformer_jax.base.log_records import read_metrics
from transformer_jax.data import prepare_corpus

GLOBAL_DEVICES = 4


def launch(config: str, workdir: pathlib.Path, num_processes: int, *args: str, multihost: bool = True,
           timeout: int = 400, devices: int = GLOBAL_DEVICES, records_name: str = "records", status: int = 0,
           **env_extra: str) -> pathlib.Path:
    """Run train.py as `num_processes` processes over `devices` devices; returns the recordings' folder."""
    records = workdir.parent / f"{workdir.name}.{records_name}"
    shutil.rmtree(records, ignore_errors=True)
    env = script_env(devices // num_processes, RECORD_TO=str(records), **env_extra)
    port = free_port()
    processes = []
    for index in range(num_processes):
        cluster = [f"--coordinator_address=localhost:{port}", f"--num_processes={num_processes}",
                   f"--process_id={index}", "--multihost"] if multihost else []
        processes.append(start_script("tests/record_batches.py", f"--config={config}", f"--workdir={workdir}",
                                      *cluster, *args, env=env))
    finish_all(processes, timeout, status)
    return records


def params_of(workdir: pathlib.Path, step: int) -> list[np.ndarray]:
    """The parameters of `step`, restored in this (single, one-device) test process."""
    return [np.asarray(x) for x in jax.tree.leaves(Checkpointer(str(workdir / "checkpoints")).restore_params(step))]


def stopped_at_step_4(workdir: pathlib.Path, copy: pathlib.Path) -> pathlib.Path:
    """A copy of a finished 6-step run as if it had stopped after its step-4 checkpoint."""
    shutil.copytree(workdir, copy)
    shutil.rmtree(copy / "checkpoints" / "6")
    assert Checkpointer(str(copy / "checkpoints"), read_only=True).latest_step() == 4
    return copy


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny run to step 6: once as 1 process x 4 devices, once as 2 processes x 2 devices; the packed rows' width
    chosen from the corpus, as configs/smoke.py's (two batch shapes, each split among the processes)."""
    directory = tmp_path_factory.mktemp("multiprocess")
    config = write_config(directory, automatic_row_width=True)
    single, multi = directory / "single", directory / "multi"
    return config, (single, launch(config, single, 1)), (multi, launch(config, multi, 2))


def test_two_processes_log_the_same_losses_and_reach_the_same_parameters_as_one(runs):
    _, (single, _), (multi, _) = runs
    assert [r["step"] for r in read_metrics(str(multi)) if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert (multi / "metrics.jsonl").read_bytes() == (single / "metrics.jsonl").read_bytes()
    # The 2-process checkpoint restores in this single process (one device) and equals the 1-process one.
    for a, b in zip(params_of(multi, 6), params_of(single, 6), strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.loads((multi / "test_final.json").read_text()) == json.loads((single / "test_final.json").read_text())


def test_each_process_reads_a_disjoint_half_of_every_global_batch(runs):
    _, (_, single_records), (_, multi_records) = runs
    reference = np.load(single_records / "process_0.npz")
    shards = [np.load(multi_records / f"process_{index}.npz") for index in range(2)]
    # Six steps consumed six batches; the prefetch thread may have built up to data.prefetch_batches + 1 more.
    ahead = tiny_run_config().data.prefetch_batches + 1
    assert all(6 <= len(records.files) <= 6 + ahead for records in [reference, *shards])
    for name in [f"arr_{index}" for index in range(6)]:
        first, second = shards[0][name], shards[1][name]
        assert len(first) == len(second) == len(reference[name]) // 2
        # In process order, the two halves are the batch one process reads alone.
        np.testing.assert_array_equal(np.concatenate([first, second]), reference[name])
        assert not {row.tobytes() for row in first} & {row.tobytes() for row in second}


def test_only_process_0_writes_the_logs(runs):
    _, _, (multi, records) = runs
    written = [json.loads((records / f"process_{index}.json").read_text())["metric_records"] for index in range(2)]
    assert written[0] == len(read_metrics(str(multi))) and written[1] == 0
    assert len(list((multi / "tensorboard").iterdir())) == 1


def test_a_one_process_checkpoint_resumes_in_two_processes(runs, tmp_path):
    config, (single, _), _ = runs
    resumed = stopped_at_step_4(single, tmp_path / "resumed")
    launch(config, resumed, 2, NO_TEST_TRANSLATION)  # the metrics and parameters are compared, not the translation
    assert (resumed / "metrics.jsonl").read_bytes() == (single / "metrics.jsonl").read_bytes()
    for a, b in zip(params_of(resumed, 6), params_of(single, 6), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_two_process_checkpoint_resumes_in_a_plain_single_process(runs, tmp_path):
    """Without jax.distributed at all, the cross-device sums use XLA's in-process collectives, which add
    in another order than gloo: the continued run agrees to float32 rounding, not bit for bit."""
    config, (single, _), (multi, _) = runs
    resumed = stopped_at_step_4(multi, tmp_path / "resumed")
    before = {k: v for k, v in snapshot(resumed / "checkpoints").items() if k.startswith("4/")}
    launch(config, resumed, 1, NO_TEST_TRANSLATION, multihost=False)
    expected, got = read_metrics(str(single)), read_metrics(str(resumed))
    assert [(r["step"], r["split"]) for r in got] == [(r["step"], r["split"]) for r in expected]
    assert got[:5] == expected[:5]  # steps 1-4 (and the dev loss at 3) come from the 2-process run
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have["loss"], want["loss"], rtol=1e-5)
    for a, b in zip(params_of(resumed, 6), params_of(single, 6), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert all(snapshot(resumed / "checkpoints").get(k) == v for k, v in before.items())


def test_two_hosts_of_two_devices_read_only_their_rows_of_a_prepared_corpus_and_resume_after_sigterm(tmp_path):
    """A pod-shaped run: hosts of 2 chips each, mesh data=2 x fsdp=2 (parameters sharded over each host's pair of
    devices), on a corpus prepared beforehand. Each process reads only the pairs of its own rows; process 1 gets
    SIGTERM mid-run, every process stops at the same step with a checkpoint and exits 143 (to be restarted), and the
    rerun ends with the metrics and parameters of one uninterrupted process of 4 devices. Two hosts show each of
    these as four would (a pod's hosts differ only in their process index), at half the processes to start."""
    config = tmp_path / "fsdp_config.py"
    config.write_text(f"exec(open({write_config(tmp_path)!r}).read())\n_tiny = get_config\n\n"
                      "def get_config():\n    config = _tiny()\n    config.mesh.update(data=2, fsdp=2)\n"
                      "    config.training.num_train_steps = 4\n    return config\n")
    # Prepared in this process by the call `transformer-jax prepare` makes (no process to start); the corpus depends on
    # the data settings alone, which the fsdp config leaves as the tiny run's.
    prepared = tmp_path / "prepared"
    prepare_corpus(tiny_run_config(), str(prepared), workers=1)
    single, multi = tmp_path / "single", tmp_path / "multi"
    reference = launch(str(config), single, 1, f"--config.data.prepared={prepared}")
    stopped = launch(str(config), multi, 2, f"--config.data.prepared={prepared}", timeout=600,
                     records_name="stopped", status=143, TERMINATE_PROCESS="1", TERMINATE_AFTER_BATCH="2")
    steps = [r["step"] for r in read_metrics(str(multi)) if r["split"] == "train"]
    assert steps and steps[-1] < 4 and (multi / "checkpoints" / str(steps[-1])).is_dir()  # stopped early, saved
    assert not (multi / "run.lock").exists()
    # Each process read from disk exactly the pairs of its own rows: about half of each batch.
    alone = json.loads((reference / "process_0.json").read_text())
    recorded = [json.loads((stopped / f"process_{index}.json").read_text()) for index in range(2)]
    for record in recorded:
        assert record["records_read"] == record["pairs_in_rows"] > 0
    assert sum(r["records_read"] for r in recorded) < alone["records_read"]
    # The first batches of the two shards, in process order, are the batches one process reads alone.
    full = np.load(reference / "process_0.npz")
    shards = [np.load(stopped / f"process_{index}.npz") for index in range(2)]
    for key in set(full.keys()).intersection(*(shard.keys() for shard in shards)):
        np.testing.assert_array_equal(np.concatenate([shard[key] for shard in shards]), full[key])
    launch(str(config), multi, 2, f"--config.data.prepared={prepared}", timeout=600, records_name="resumed")
    assert [r["step"] for r in read_metrics(str(multi)) if r["split"] == "train"] == [1, 2, 3, 4]
    # Both go through the multi-process runtime, so their sums are taken in the same order (README).
    assert (multi / "metrics.jsonl").read_bytes() == (single / "metrics.jsonl").read_bytes()
    for a, b in zip(params_of(multi, 4), params_of(single, 4), strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.loads((multi / "test_final.json").read_text()) == json.loads((single / "test_final.json").read_text())
