"""Helpers for tests that run train.py and eval.py as a user does: config files, subprocesses, workdir snapshots.

Subprocesses share the suite's persistent JAX compilation cache (a temporary directory per test run, made by
tests/conftest.py and named by $JAX_COMPILATION_CACHE_DIR), so each launch after the first skips most compiling;
it changes how fast a run starts, never what it computes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
# The suite's compilation cache when tests/conftest.py did not set one (a helper imported outside pytest).
FALLBACK_COMPILE_CACHE = pathlib.Path(tempfile.gettempdir()) / f"transformer_jax_test_compile_cache_{os.getuid()}"


# XLA:CPU compiles of the suite skip LLVM's optimisation passes and emit fused loops with XLA:CPU's older elemental
# emitters instead of its MLIR fusion emitters: the same programs (XLA's own passes all run), compiled in a fraction of
# the CPU time (the first flags: about 60%; the older emitters then take the tiny run's train step, dev loss and search
# from 4.4 s of CPU to 1.8 s, 2026-12-04) and run slower, which tests of a few steps do not feel (the tiny run's warm
# train.py takes as long either way). Values may differ from XLA:CPU's defaults in the last bits (LLVM fuses
# multiply-adds when it optimises; the two emitters order some operations differently); every comparison in the suite is
# between programs compiled alike, and where a test asserts that two different programs give the same bits, or rests on
# the trajectory of many updates, it compiles as XLA:CPU does by default (FUSION_EMITTERS, DEFAULT_EMITTER_FLAGS).
# tests/conftest.py puts the flags in XLA_FLAGS before JAX starts; subprocesses inherit them (script_env and
# cpu_xla_flags keep them next to a device count). libtpu's compiles for the preflight's TPU topologies give the same
# memory, cost and cycle figures with them (compared 2026-11-28; with the elemental emitters 2026-12-04: the base model
# with one layer on v5e-8, the same report line for line).
# The user-compile lane (`make test-user`, tests/README.md) has none of them: its processes compile as a user's do.
DEFAULT_EMITTER_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
USER_COMPILE = os.environ.get("TRANSFORMER_JAX_USER_COMPILE") == "1"
CPU_COMPILE_FLAGS = "" if USER_COMPILE else f"{DEFAULT_EMITTER_FLAGS} --xla_cpu_use_fusion_emitters=false"
# One compile with XLA:CPU's own fused-loop emitters: `jitted.lower(...).compile(compiler_options=FUSION_EMITTERS)`.
FUSION_EMITTERS = {"xla_cpu_use_fusion_emitters": True}


# For a train.py run whose test translation, scores and plots no assertion reads: it ends at its last checkpoint
# (eval.test_at_end; 1.5-3 s of CPU less a finished launch).
NO_TEST_TRANSLATION = "--config.eval.test_at_end=False"


def cpu_xla_flags(devices: int | None = None, flags: str = CPU_COMPILE_FLAGS) -> str:
    """XLA_FLAGS for a test's JAX process: the suite's compile `flags`, with `devices` CPU devices when given."""
    count = None if devices is None else f"--xla_force_host_platform_device_count={devices}"
    return " ".join(filter(None, [flags, count]))


def compile_cache() -> str:
    """The compilation cache the suite's processes share: $JAX_COMPILATION_CACHE_DIR (tests/conftest.py)."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(FALLBACK_COMPILE_CACHE)


# configs/smoke.py chooses its packed rows' width from the corpus (data.row_width=0): two batch shapes, 11x48 and 8x64.
# The suite's tiny run takes rows of data.max_length instead, one shape: every launch then traces, lowers and loads
# (or compiles) one train step less, about 1 s of a warm tiny train.py's 7 s of CPU. Tests of the automatic width and
# of resuming among batches of several shapes set it back (write_config's automatic_row_width: the crash-and-resume
# runs and the two-process equality; data.row_width=0 in process: tests/data).
def tiny_run_config():
    """configs/smoke.py: the demo run shrunk to seconds (a small built-in corpus, a tiny model, 6 steps), its rows
    data.max_length wide (one batch shape, above)."""
    import importlib.util

    path = ROOT / "configs" / "smoke.py"
    spec = importlib.util.spec_from_file_location("smoke_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.data.row_width = config.data.max_length
    return config


def write_config(directory: pathlib.Path, *, automatic_row_width: bool = False) -> str:
    """A config file for the tiny run of tiny_run_config (configs/smoke.py); returns its path. `automatic_row_width`:
    the packed rows' width chosen from the corpus, as configs/smoke.py's (two batch shapes; tiny_run_config has one)."""
    path = directory / "tiny_config.py"
    width = "    config.data.row_width = 0\n" if automatic_row_width else ""
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom runs import tiny_run_config\n\n"
        f"def get_config():\n    config = tiny_run_config()\n{width}    return config\n"
    )
    return str(path)


def script_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a train.py/eval.py subprocess: CPU with `devices` devices, the shared compile cache."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_xla_flags(devices),
               JAX_COMPILATION_CACHE_DIR=compile_cache(), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.update(extra)
    return env


def command(script: str, *args: str) -> list[str]:
    """The command line running `script` (relative to the repository root) with this interpreter."""
    return [sys.executable, str(ROOT / script), *map(str, args)]


def run_script(script: str, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """Run train.py / eval.py to completion; returns its exit status and captured output."""
    return subprocess.run(command(script, *args), cwd=ROOT, input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env or script_env())


def start_script(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start train.py / eval.py in the background (output captured)."""
    return subprocess.Popen(command(script, *args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or script_env())


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """A user error: exit status 2, no traceback, exactly one `error: ...` line holding every fragment."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def snapshot(directory: pathlib.Path) -> dict[str, str]:
    """{relative path: sha256 of its bytes} of every file under `directory`."""
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def free_port() -> int:
    """A TCP port on localhost that is free right now (for a coordinator)."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def wait_until_idle(process: subprocess.Popen, quiet: float = 1.0, timeout: float = 120) -> None:
    """Until `process` (and its threads) used no more than 2% of a core for `quiet` seconds: past its imports (CPU
    bound) and into a wait. Sooner than a fixed sleep long enough for a loaded machine, which idles a worker."""
    import time

    def cpu() -> float:
        fields = pathlib.Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    deadline, last, since = time.monotonic() + timeout, cpu(), time.monotonic()
    while time.monotonic() < deadline:
        assert process.poll() is None, "the process ended"
        time.sleep(quiet / 4)
        now = cpu()
        if now - last > 0.02 * (time.monotonic() - since):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
    raise AssertionError(f"the process was still busy after {timeout:g} s")


def finish_all(processes: list[subprocess.Popen], timeout: float = 300, status: int = 0) -> list[tuple[str, str]]:
    """Wait for every process (killing all of them on a timeout); their (stdout, stderr), each exited with `status`
    (0: finished; 143: stopped by SIGTERM before the last step)."""
    try:
        results = [process.communicate(timeout=timeout) for process in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        raise
    for process, (_, stderr) in zip(processes, results):
        assert process.returncode == status, (stderr or "")[-3000:]
    return results


def run_rows(script: str, rows: list[list[str]], directory: pathlib.Path) -> list[subprocess.CompletedProcess]:
    """Each command line of `rows` run through `script`'s own flag parsing and main, all in one process."""
    rows_file, out = directory / f"{script}.rows.json", directory / f"{script}.results.json"
    rows_file.write_text(json.dumps(rows))
    done = subprocess.run(command("tests/cli_rows.py", script, rows_file, out), cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [subprocess.CompletedProcess(args, r["returncode"], r["stdout"], r["stderr"])
            for args, r in zip(rows, json.loads(out.read_text()))]


def copy_run(trained_run: dict, destination: pathlib.Path) -> pathlib.Path:
    """A copy of the trained run at `destination` (which must not exist), for a test to change."""
    shutil.copytree(trained_run["workdir"], destination)
    return destination


@contextlib.contextmanager
def small_disk(path: pathlib.Path, size: str) -> Iterator[pathlib.Path]:
    """A real file system of `size` (e.g. "4m") mounted at `path` for the block: a disk that fills up.

    A tmpfs: writes past its size fail with ENOSPC as on a full disk. Mounting needs root (or
    CAP_SYS_ADMIN), which this project's test machines and CI have.
    """
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True)


def fill(directory: pathlib.Path, leave: int = 0) -> None:
    """Fill the file system holding `directory` up to `leave` free bytes (a file named .filler)."""
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    with open(directory / ".filler", "wb") as file:
        file.write(b"\0" * max(0, free - leave))


def _stored_arrays(state_dir: pathlib.Path) -> dict[bytes, bytes] | None:
    """{array key: bytes} of every array of an Orbax OCDBT `state_dir` read with no cache, or None when
    one cannot be read."""
    import tensorstore as ts

    kvstore = {"driver": "ocdbt", "base": f"file://{state_dir}"}
    try:
        keys = ts.KvStore.open(kvstore).result().list().result()
        arrays = {}
        for key in (key for key in keys if key.endswith(b"/.zarray")):
            path = key.removesuffix(b"/.zarray").decode()
            spec = {"driver": "zarr", "kvstore": kvstore, "path": path, "recheck_cached_data": False}
            arrays[key] = ts.open(spec).result().read().result().tobytes()
        return arrays
    except ValueError:
        return None


def flip_a_readable_bit(state_dir: pathlib.Path) -> pathlib.Path:
    """Flip one bit of the biggest data file of an Orbax checkpoint's `state_dir` at a place where every
    array still reads but one stored value changed (the arrays are zstd-compressed: most flips break the
    stream, which is another damage), so that only a checksum can tell. Returns the file changed."""
    path = max((p for p in state_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    original, intact = path.read_bytes(), _stored_arrays(state_dir)
    for offset in range(len(original) // 2, len(original), 61):
        data = bytearray(original)
        data[offset] ^= 0x10
        path.write_bytes(bytes(data))
        changed = _stored_arrays(state_dir)
        if changed is not None and changed != intact:
            return path
    path.write_bytes(original)
    raise AssertionError(f"no bit of {path} could be flipped with the arrays still readable")
