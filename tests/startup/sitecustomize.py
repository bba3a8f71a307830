"""Imported at the start of every Python process the suite starts (tests/conftest.py puts this directory on
$PYTHONPATH; not in the user-compile lane, tests/README.md): on the CPU backend, JAX's compilation cache keys name the
processes' devices, not the host's topology.

JAX keys a cached program by, among others, the topology of the devices it runs on. XLA:CPU has no topology shared
by the processes of a jax.distributed run: each process's differs, so the program process 0 stored (JAX stores from
process 0 only) is never found by the others, and every other process of every multi-process test compiled each of
its programs anew (about 10 s of CPU a process). TPU and GPU processes share one topology, so on them JAX finds
process 0's programs already. Here, for CPU devices, the key takes the devices themselves (ids, processes, kinds),
as JAX does for backends without a topology: the same global program gets the same key in every process, and each
process loads what process 0 compiled. It changes which compiles are skipped, never what a program computes; the
multi-process tests compare their results with one process's bit for bit.

The processes of one run reach each program at about the same moment, so the others would still compile, in
parallel with process 0, every program the cache did not hold yet (each run's first: about 10 s of CPU a process,
on cores the other tests need). On a miss, a process other than 0 waits for process 0 to store the program (JAX
stores from process 0 only) and loads it, as JAX's jax_share_binary_between_hosts has the other hosts wait for
process 0's binary; it compiles after all only where process 0 stores nothing (host callbacks) or has not stored the
program after WAIT_SECONDS. The programs a process runs on its own devices alone (the eager operations on its rows:
hundreds of small compiles a launch) it stores itself, which JAX leaves to process 0 only, for its own programs too:
the next run's process 1 loads them.

The hook replaces private names of JAX (REPLACED). It was written for JAX WRITTEN_FOR; a JAX without one of those
names ends the process at once with one line naming the version and the name, instead of an AttributeError later in
every process the suite starts.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

_MODULE = "jax._src.cache_key"
_COMPILER = "jax._src.compiler"
_MONITORING = "jax._src.monitoring"
WAIT_SECONDS = 120.0  # at most, for process 0's copy of a program (a tiny run's compile: seconds)
WRITTEN_FOR = "0.10.2"  # the JAX release this hook was written and measured for
# The names it replaces or calls, by module.
REPLACED = {_MODULE: ("_hash_accelerator_config",), _COMPILER: ("_compile_and_write_cache", "backend_compile_and_load"),
            "jax._src.compilation_cache": ("put_executable_and_time", "get_executable_and_time"),
            "jax._src.distributed": ("global_state",)}


def missing_names(module) -> str | None:
    """The line for a JAX whose `module` lacks a name this hook needs (None: all are there)."""
    absent = [name for name in REPLACED[module.__name__] if not hasattr(module, name)]
    if not absent:
        return None
    from importlib.metadata import version

    return (f"tests/startup/sitecustomize.py was written for JAX {WRITTEN_FOR}; JAX {version('jax')}'s "
            f"{module.__name__} has no {', '.join(absent)}: update the hook for this JAX (or take it off the "
            "suite's PYTHONPATH in tests/conftest.py, at the cost of compiling in every process)")


def _check(module) -> None:
    """End the process with `missing_names`'s line when `module` lacks a name the hook needs."""
    problem = missing_names(module)
    if problem:
        sys.stderr.write(f"error: {problem}\n")
        sys.stderr.flush()
        os._exit(2)


def _patch(cache_key) -> None:
    _check(cache_key)
    topology_hash = cache_key._hash_accelerator_config

    def hash_accelerator_config(hash_obj, accelerators) -> None:
        devices = list(accelerators.flat)
        if devices and all(device.platform == "cpu" for device in devices):
            hash_obj.update(repr([(d.id, d.process_index, d.device_kind) for d in devices]).encode())
        else:
            topology_hash(hash_obj, accelerators)

    cache_key._hash_accelerator_config = hash_accelerator_config


def _patch_compiler(compiler) -> None:
    _check(compiler)
    compile_and_write_cache = compiler._compile_and_write_cache

    def compile_load_or_wait(backend, computation, executable_devices, compile_options, host_callbacks, module_name,
                             cache_key):
        from jax._src import compilation_cache, distributed

        for module in (compilation_cache, distributed):
            _check(module)
        process, devices = distributed.global_state.process_id, list(executable_devices)
        processes = {device.process_index for device in devices}
        shared = (process not in (None, 0) and not host_callbacks and all(d.platform == "cpu" for d in devices)
                  and compiler.config.persistent_cache_min_compile_time_secs.value == 0)  # process 0 stores all
        if shared and processes == {process}:  # on this process's devices only: no other process compiles or stores it
            started = time.monotonic()
            executable = compiler.backend_compile_and_load(backend, computation, executable_devices, compile_options,
                                                           host_callbacks)
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                      int(time.monotonic() - started))
            return executable
        if shared and 0 in processes:  # process 0 compiles it too, and stores it
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline:
                time.sleep(0.05)
                try:  # a file process 0 is still writing fails to decompress: read it again
                    executable, _ = compilation_cache.get_executable_and_time(
                        cache_key, compile_options, backend, executable_devices)
                except Exception:
                    executable = None
                if executable is not None:
                    return executable
        return compile_and_write_cache(backend, computation, executable_devices, compile_options, host_callbacks,
                                       module_name, cache_key)

    compiler._compile_and_write_cache = compile_load_or_wait


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs patches[name](module) once module `name` is imported."""

    def __init__(self, patches) -> None:
        self.patches = dict(patches)

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        patch = self.patches.pop(name)  # popped first: the find_spec below comes back here and finds nothing to do
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module) -> None:
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _profile(log: str):
    """With $TRANSFORMER_JAX_TEST_PROCESS_LOG set, each process appends one JSON line to that file at exit: the test
    that started it ($PYTEST_CURRENT_TEST, which pytest sets and the process inherits), its command line, wall and
    CPU seconds, the seconds JAX reports for tracing, lowering, compiling and cache reads, and which of the end of a
    run's heavy imports it made (matplotlib and sacremoses: a run's plots and paper-style BLEU; torch). A measurement of
    where the suite's CPU goes (docs/benchmarks/test_suite.md); it changes nothing a process does."""
    import atexit
    import json
    import time

    started, durations = time.time(), {}

    def listen(monitoring) -> None:
        def record(event: str, seconds: float, **_) -> None:
            durations[event] = durations.get(event, 0.0) + seconds

        monitoring.register_event_duration_secs_listener(record)

    def write() -> None:
        times = os.times()
        line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": sys.argv, "wall": time.time() - started,
                "cpu": times.user + times.system, "jax": {k: round(v, 3) for k, v in durations.items()},
                "imported": [name for name in ("matplotlib", "sacremoses", "torch") if name in sys.modules]}
        try:
            with open(log, "a") as file:
                file.write(json.dumps(line) + "\n")
        except PermissionError:  # a process a test runs as another user (tests/cli/test_path_faults.py): unlogged
            pass

    atexit.register(write)
    return listen


_patches = {_MODULE: _patch, _COMPILER: _patch_compiler}
if os.environ.get("TRANSFORMER_JAX_TEST_PROCESS_LOG"):
    _patches[_MONITORING] = _profile(os.environ["TRANSFORMER_JAX_TEST_PROCESS_LOG"])
sys.meta_path.insert(0, _PatchOnImport(_patches))
