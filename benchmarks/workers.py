"""Contenders in worker processes, driven alternately; and the command that starts a section's worker.

Running PyTorch and JAX in one process slows whichever runs second (measured: our base step went from
2.93 to 3.27 s once the peer had run in the same process), so each contender lives in a worker
process that waits on a pipe while the other one runs: the same machine, the same run, alternating
rounds, and no shared allocator or thread pools. Sections also start workers to fix what JAX fixes
at start-up (CPU device counts, platforms, several processes).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
PREFIX = "@@ "  # marks protocol lines on the worker's stdout (libraries may print there too)


def worker_command(section: str, spec: dict[str, Any]) -> list[str]:
    """`python -m benchmarks.run` running `section`'s `worker(spec)` in a new process (run it from REPO, or
    with REPO on PYTHONPATH)."""
    return [sys.executable, "-m", "benchmarks.run", f"--worker={section}", f"--worker_spec={json.dumps(spec)}"]


class Worker:
    """The client side: start a worker, time steps on it, read its peak memory."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: str | pathlib.Path = REPO) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                        env=env, cwd=cwd)
        self.ready = self._reply()  # {"compile_s": ...} once built, compiled and warmed up

    def _reply(self) -> dict[str, Any]:
        for line in self.process.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        raise RuntimeError(f"benchmark worker exited with status {self.process.wait()}")

    def _ask(self, request: str) -> dict[str, Any]:
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        return self._reply()

    def seconds_per_step(self, steps: int) -> float:
        return self._ask(f"time {steps}")["seconds_per_step"]

    def memory(self) -> dict[str, Any]:
        return self._ask("memory")

    def describe(self) -> dict[str, Any]:
        return self._ask("describe")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark (VmHWM; ru_maxrss would include the parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def serve(
    build: Callable[[], Callable[[], Any]], memory: Callable[[], dict[str, Any]],
    describe: Callable[[], dict[str, Any]] = dict,
) -> None:
    """The worker side: build (and warm up) the step, then answer `time N`, `memory` and `describe`
    (whatever else the contender reports, e.g. a digest of its output) until stdin closes."""
    start = time.perf_counter()
    step = build()
    step()
    print(PREFIX + json.dumps({"compile_s": time.perf_counter() - start}), flush=True)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "time":
            count = int(rest[0])
            start = time.perf_counter()
            for _ in range(count):
                step()
            reply: dict[str, Any] = {"seconds_per_step": (time.perf_counter() - start) / count}
        elif command == "describe":
            reply = describe()
        else:
            reply = memory()
        print(PREFIX + json.dumps(reply), flush=True)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the harness's machine() gives only its architecture)."""
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")
