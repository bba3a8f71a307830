"""Imported at the start of every Python process the suite starts (tests/conftest.py puts this directory on
$PYTHONPATH): on the CPU backend, JAX's compilation cache keys name the processes' devices, not the host's topology.

JAX keys a cached program by, among others, the topology of the devices it runs on. XLA:CPU has no topology shared
by the processes of a jax.distributed run: each process's differs, so the program process 0 stored (JAX stores from
process 0 only) is never found by the others, and every other process of every multi-process test compiled each of
its programs anew (about 10 s of CPU a process). TPU and GPU processes share one topology, so on them JAX finds
process 0's programs already. Here, for CPU devices, the key takes the devices themselves (ids, processes, kinds),
as JAX does for backends without a topology: the same global program gets the same key in every process, and each
process loads what process 0 compiled. It changes which compiles are skipped, never what a program computes; the
multi-process tests compare their results with one process's bit for bit.
"""

import importlib.abc
import importlib.util
import os
import sys

_MODULE = "jax._src.cache_key"
_MONITORING = "jax._src.monitoring"


def _patch(cache_key) -> None:
    topology_hash = cache_key._hash_accelerator_config

    def hash_accelerator_config(hash_obj, accelerators) -> None:
        devices = list(accelerators.flat)
        if devices and all(device.platform == "cpu" for device in devices):
            hash_obj.update(repr([(d.id, d.process_index, d.device_kind) for d in devices]).encode())
        else:
            topology_hash(hash_obj, accelerators)

    cache_key._hash_accelerator_config = hash_accelerator_config


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
    CPU seconds, and the seconds JAX reports for tracing, lowering, compiling and cache reads. A measurement of
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
                "cpu": times.user + times.system, "jax": {k: round(v, 3) for k, v in durations.items()}}
        with open(log, "a") as file:
            file.write(json.dumps(line) + "\n")

    atexit.register(write)
    return listen


_patches = {_MODULE: _patch}
if os.environ.get("TRANSFORMER_JAX_TEST_PROCESS_LOG"):
    _patches[_MONITORING] = _profile(os.environ["TRANSFORMER_JAX_TEST_PROCESS_LOG"])
sys.meta_path.insert(0, _PatchOnImport(_patches))
