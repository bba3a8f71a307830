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
import sys

_MODULE = "jax._src.cache_key"


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
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module) -> None:
            load(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
