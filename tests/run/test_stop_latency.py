"""A SIGTERM at a random point of a run whose updates take a second or more, through the real command (train.py):
exit 143 within training.max_updates_in_flight + 1 updates plus the checkpoint's write (not at the end of the log
window, 100 updates away), nothing lost, and the same command resumes to exactly the state of a run never stopped.
One process, and two (jax.distributed on localhost, the signal to process 1 only).

The one-process run is stopped twice at random moments (the seed is in every failure message): once from the start,
once after resuming with the same command; the two-process run once, from the start (after the resume the processes
stop by the same code, which the one-process case times; a two-process run resumed after a SIGTERM to process 1 ends
with the bits of one never stopped: tests/run/test_multiprocess.py). An uninterrupted run to the last stop's step
must then hold the same arrays, data position and window metrics, bit for bit.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import signal
import subprocess
import time

import pytest

from runs import NO_TEST_TRANSLATION, _stored_arrays, finish_all, free_port, script_env, start_script, write_config
from transformer_jax.base import workdir as layout
from transformer_jax.base.log_records import read_metrics
from transformer_jax.run.log_window import summarize_window

IN_FLIGHT = 2  # training.max_updates_in_flight's default
# The smoke run widened so that an update takes a second or more on this CPU (about 1.2 s alone, 2026-12-07), with one
# log window for the whole run: unbounded, the host would dispatch up to step 100 and a stop would wait for all of it.
SIZES = ("--config.data.builtin_train_size=4000", "--config.data.vocab_size=1000", "--config.model.d_model=128",
         "--config.model.d_ff=512", "--config.training.log_every=100", "--config.training.eval_every=0",
         "--config.training.checkpoint_every=1000", NO_TEST_TRANSLATION)
# Per update. Two processes share the same two cores, each on about one: each computes half of the same 12,288
# tokens, and their update takes about as long as one process's on both (each computing 12,288 took twice as long).
TOKENS = {1: 12288, 2: 12288}
STOPS = {1: 2, 2: 1}  # random stops of each run (module docstring)
STEPS = 100
STOP_LINE = re.compile(r"stopped by (signal 15|a signal to another process) at step (\d+): checkpoint (\d+) saved "
                       r"([\d.]+) s after (?:the signal, which arrived|the processes agreed to stop,) at step (\d+)")


def launch(config: str, workdir: pathlib.Path, processes: int, steps: int, counts: pathlib.Path
           ) -> list[subprocess.Popen]:
    """train.py as `processes` processes of one CPU device each, counting their updates under `counts`."""
    flags = [f"--config={config}", f"--workdir={workdir}", *SIZES, f"--config.training.num_train_steps={steps}",
             f"--config.data.tokens_per_batch={TOKENS[processes]}"]
    if processes == 1:
        return [start_script("tests/run/train_counting_steps.py", *flags, env=script_env(1, STEPS_TO=str(counts)))]
    port = free_port()
    return [start_script("tests/run/train_counting_steps.py", *flags, "--multihost", f"--process_id={index}",
                         f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
                         env=script_env(1, STEPS_TO=str(counts)))
            for index in range(processes)]


def updates_made(counts: pathlib.Path, index: int) -> int:
    path = counts / f"process_{index}.txt"
    lines = path.read_text().split() if path.exists() else []
    return int(lines[-1]) if lines else 0


def stop_at_random(config: str, workdir: pathlib.Path, processes: int, chooser: random.Random, seed: int,
                   counts: pathlib.Path) -> dict:
    """Start the run, SIGTERM the last process at a random moment after its first update; what the stop says."""
    running = launch(config, workdir, processes, STEPS, counts)
    deadline = time.time() + 240
    while updates_made(counts, processes - 1) < 1 and time.time() < deadline:
        assert all(p.poll() is None for p in running), f"seed {seed}: a process ended before its first update"
        time.sleep(0.01)
    # Where in an update the signal lands is what varies: 1.5 s spans more than one update (and the queue of
    # updates in flight is full from the second on); a longer wait would only add updates to this run and the
    # reference.
    time.sleep(chooser.uniform(0.0, 1.5))
    signalled = time.perf_counter()
    running[-1].send_signal(signal.SIGTERM)
    outputs = finish_all(running, 240, status=143)
    exit_seconds = time.perf_counter() - signalled
    lines = [STOP_LINE.findall(stdout + stderr) for stdout, stderr in outputs]
    assert all(len(found) == 1 for found in lines), f"seed {seed}: {outputs[-1][1][-3000:]}"
    stops = [found[0] for found in lines]
    assert len({stop[1] for stop in stops}) == 1, f"seed {seed}: processes stopped at different steps: {stops}"
    by, step, checkpoint, seconds, arrived = stops[-1]  # the signalled process's own line
    assert by == "signal 15" and checkpoint == step, f"seed {seed}: {stops}"
    assert all(stop[0] == "a signal to another process" for stop in stops[:-1]), f"seed {seed}: {stops}"
    made = [updates_made(counts, index) for index in range(processes)]
    assert len(set(made)) == 1, f"seed {seed}: updates made by each process {made}"  # none ran on alone
    timing = [json.loads(line) for line in (workdir / layout.TIMING).read_text().splitlines()]
    write = [t["checkpoint_write_seconds"] for t in timing if "checkpoint_write_seconds" in t][-1]
    return {"step": int(step), "arrived": int(arrived), "seconds": float(seconds), "exit_seconds": exit_seconds,
            "write_seconds": write, "stop_record": [t for t in timing if "stop_seconds" in t][-1]}


def checkpoint(workdir: pathlib.Path, step: int) -> tuple[dict, dict, dict]:
    """A checkpoint's arrays (every one, as stored), data position and meta record."""
    directory = workdir / layout.CHECKPOINTS / str(step)
    arrays = _stored_arrays(directory / "state")
    records = [json.loads((directory / item / "metadata").read_text()) for item in ("data", "meta")]
    return arrays, records[0], records[1]


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_at_random_points_stops_within_the_bound_and_resumes_exactly(tmp_path, processes):
    seed = int.from_bytes(os.urandom(4), "little")
    chooser = random.Random(seed)
    config, workdir = write_config(tmp_path), tmp_path / "stopped"
    # The same command each time: from the start, then resuming.
    stops = [stop_at_random(config, workdir, processes, chooser, seed, tmp_path / f"counts_{index}")
             for index in range(STOPS[processes])]
    assert [stop["step"] for stop in stops] == sorted({stop["step"] for stop in stops}), f"seed {seed}: {stops}"
    last = stops[-1]["step"]
    assert last < STEPS, f"seed {seed}: {stops}"

    reference = tmp_path / "uninterrupted"
    finish_all(launch(config, reference, processes, last, tmp_path / "counts_reference"), 300)
    (window,) = [t for t in map(json.loads, (reference / layout.TIMING).read_text().splitlines())
                 if "seconds_per_step" in t]
    update_seconds = window["seconds_per_step"]
    assert update_seconds >= 0.5, f"updates of {update_seconds:.2f} s: the run is too small to show the bound"
    for stop in stops:
        # The signal arrived at one step; the checkpoint is of that step or at most K after it.
        assert stop["arrived"] <= stop["step"] <= stop["arrived"] + IN_FLIGHT, f"seed {seed}: {stop}"
        assert stop["stop_record"]["step"] == stop["step"]
        # At most K + 1 updates and the save (with room for a loaded machine), where the window's end was up to
        # ~95 updates away; the process ends soon after.
        bound = 1.5 * ((IN_FLIGHT + 1) * update_seconds + stop["write_seconds"]) + 2.0
        assert stop["seconds"] <= bound, f"seed {seed}: {stop}, {update_seconds:.2f} s an update"
        assert stop["exit_seconds"] <= bound + 10.0, f"seed {seed}: {stop}"

    # Nothing lost: the arrays, the data position and every step's metrics of an uninterrupted run, bit for bit.
    arrays, data, meta = checkpoint(workdir, last)
    expected_arrays, expected_data, _ = checkpoint(reference, last)
    assert arrays and arrays == expected_arrays, f"seed {seed}: the stopped run's state differs"
    assert data == expected_data
    assert len(meta["open_window"]) == last  # no log line yet: every step is in the open window
    (logged,) = [r for r in read_metrics(str(reference)) if r["split"] == "train"]
    summary = summarize_window(meta["open_window"])
    assert {key: logged[key] for key in summary} == summary
    assert not (workdir / layout.METRICS).exists()
