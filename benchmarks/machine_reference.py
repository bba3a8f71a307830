"""How fast this machine runs the test suite's kind of work: one smoke training, timed, before the suite.

    python -m benchmarks.machine_reference

Runs `train.py --config=configs/smoke.py` (the run most of the suite's train.py launches are made of) once in a
fresh process on the CPU, with a new, empty compile cache, and prints its wall time and the CPU seconds of the
process. The suite is CPU-bound, and machines of one kind (2 cores "AMD EPYC") ran it in 23 to 38 minutes, one VM
27 and 36 minutes 40 minutes apart (docs/benchmarks/test_suite.md). `.ci/run` prints this line before the suite
and again after the user-compile lane, and reports each lane's wall time as a multiple of the mean of the two: a
rough gauge of the machine (it read about the same after those two runs, so it does not capture everything that
slows a suite that keeps both cores busy; one reading alone moved 15.1-17.5 s between runs of the same tests).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks.workers import REPO, cpu_model


def smoke_training_seconds() -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one smoke training from an empty compile cache."""
    with tempfile.TemporaryDirectory(prefix="machine_reference_") as scratch:
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=os.path.join(scratch, "cache"))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "train.py", "--config=configs/smoke.py",
                               f"--workdir={os.path.join(scratch, 'run')}"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the smoke training failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    wall, cpu = smoke_training_seconds()
    print(f"machine reference: smoke train.py, empty compile cache: {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"({os.cpu_count()} cores, {cpu_model()})", flush=True)


if __name__ == "__main__":
    main()
