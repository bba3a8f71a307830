"""The suite's start-up hook (sitecustomize.py, imported by every process a test starts): a JAX without a name it
replaces ends the process with one line naming the JAX version and the name, not an AttributeError. And which lane
compiles how: the suite with its XLA_FLAGS and the hook, the user-compile lane as a user's process does."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

from runs import CPU_COMPILE_FLAGS, ROOT, script_env

STARTUP = pathlib.Path(__file__).resolve().parent

CHECK = """
import types, sitecustomize
print(sitecustomize.missing_names(__import__("jax._src.cache_key", fromlist=["_"])))
sitecustomize._check(types.ModuleType("jax._src.cache_key"))  # a JAX whose cache_key lacks the hashing function
print("not stopped")
"""


def test_a_jax_without_the_replaced_names_is_one_line_naming_them():
    result = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=script_env(PYTHONPATH=str(STARTUP)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "None\n", result.stderr[-2000:]  # this JAX has every name
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: tests/startup/sitecustomize.py was written for JAX 0.10.2; JAX ") and \
        "jax._src.cache_key has no _hash_accelerator_config: update the hook" in line, line


# A process compiles one small program into an empty cache and says what shaped it: XLA_FLAGS, the hook (if it was
# imported), and the files JAX stored, whose names hold JAX's cache keys (the program, the XLA flags, the devices, and
# the cache's own path: the two processes compared use the same one).
PROBE = """
import json, os, sys
import jax, jax.numpy as jnp
jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
hook = sys.modules.get("sitecustomize")
print(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", ""), "hook": hook and hook.__file__,
                  "stored": sorted(os.listdir(os.environ["JAX_COMPILATION_CACHE_DIR"]))}))
"""
# What the suite sets that shapes a compile, left out of a user's process (which asks for one CPU device as the docs
# show); JAX's cache thresholds stay, as they decide only which programs are stored.
SUITE_SETTINGS = ("XLA_FLAGS", "PYTHONPATH", "JAX_COMPILATION_CACHE_DIR")


def probe(env: dict[str, str], cache: pathlib.Path) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**env, "JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_a_process_a_test_starts_compiles_as_its_lane_says(user_compile, tmp_path):
    """The user-compile lane (tests/README.md): the processes its tests start store the program a user's process
    stores, under the same cache key; the suite's differ in their XLA flags and the hook's key."""
    user = {key: value for key, value in os.environ.items() if key not in SUITE_SETTINGS}
    alone = probe({**user, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"},
                  tmp_path / "cache")
    assert alone["hook"] is None and len(alone["stored"]) >= 1
    started = probe(script_env(1), tmp_path / "cache")
    if user_compile:
        assert "XLA_FLAGS" not in os.environ  # in this process too
        assert started["hook"] is None and started["xla_flags"] == "--xla_force_host_platform_device_count=1", started
        assert started["stored"] == alone["stored"]
    else:
        assert started["hook"] == str(STARTUP / "sitecustomize.py")
        assert set(CPU_COMPILE_FLAGS.split()) <= set(started["xla_flags"].split()), started
        assert not set(started["stored"]) & set(alone["stored"])
