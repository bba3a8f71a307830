"""The persistent compilation cache train.py and eval.py turn on: where it lives, and that it is used."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from runs import ROOT
from transformer_jax.base.compile_cache import compilation_cache_dir, default_cache_dir, use_compilation_cache


def test_the_home_cache_lives_under_xdg_cache_home_unless_jax_is_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == os.path.join(str(tmp_path), "transformer_jax", "xla")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/else")
    assert default_cache_dir() == "/somewhere/else"


def test_one_host_defaults_to_the_home_cache_and_multihost_to_the_workdirs(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    home = os.path.join(str(tmp_path), "transformer_jax", "xla")
    assert compilation_cache_dir(None, "gs://bucket/run", multihost=False) == home
    assert compilation_cache_dir(None, "gs://bucket/run", multihost=True) == "gs://bucket/run/compilation_cache"
    assert compilation_cache_dir("workdir", "runs/demo", multihost=False) == "runs/demo/compilation_cache"
    assert compilation_cache_dir("/fast/disk", "runs/demo", multihost=True) == "/fast/disk"
    assert compilation_cache_dir("", "runs/demo", multihost=True) == ""  # off
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/else")  # replaces either default, not a choice
    assert compilation_cache_dir(None, "runs/demo", multihost=True) == "/somewhere/else"
    assert compilation_cache_dir("workdir", "runs/demo", multihost=True) == "runs/demo/compilation_cache"


@pytest.fixture
def restore_cache_settings():
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_enable_xla_caches")
    saved = {name: getattr(jax.config, name) for name in names}
    compilation_cache.reset_cache()  # JAX opens its cache once, at the first compile after a directory is set
    yield
    compilation_cache.reset_cache()
    for name, value in saved.items():
        jax.config.update(name, value)


def test_a_compiled_program_is_stored_in_the_workdir_and_an_empty_choice_turns_the_cache_off(
        tmp_path, restore_cache_settings):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # store even this small program
    assert use_compilation_cache("workdir", str(tmp_path)) == str(tmp_path / "compilation_cache")
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
    assert os.listdir(tmp_path / "compilation_cache")  # one entry (at least) for the program just compiled
    assert use_compilation_cache("", str(tmp_path)) == ""
    assert jax.config.jax_compilation_cache_dir is None


# One process of a run: resolves --compilation_cache as train.py does, compiles a tiny program and counts
# JAX's cache events (each compile request is a hit, or a compile whose program is stored).
PROCESS = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring
from transformer_jax.base.compile_cache import use_compilation_cache

choice, workdir, multihost = sys.argv[1] or None, sys.argv[2], sys.argv[3] == "multihost"
events = []
monitoring.register_event_listener(lambda event, **kwargs: events.append(event))
directory = use_compilation_cache(choice, workdir, multihost)
jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
print(json.dumps({"directory": directory, "xla_caches": jax.config.jax_persistent_cache_enable_xla_caches,
                  "requests": events.count("/jax/compilation_cache/compile_requests_use_cache"),
                  "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "stored": events.count("/jax/compilation_cache/cache_misses")}))
"""


def run_process(choice: str | None, workdir: str, multihost: bool, env: dict[str, str]) -> dict:
    result = subprocess.run([sys.executable, "-c", PROCESS, choice or "", workdir, "multihost" if multihost else "-"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_a_program_one_process_stores_in_a_gs_workdir_is_loaded_by_the_next(gcs_emulator, gcs_workdir):
    import fsspec

    env = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    env.update(gcs_emulator, JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.pop("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", None)
    cache = f"{gcs_workdir}/compilation_cache"
    bucket = fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)

    first = run_process("workdir", gcs_workdir, False, env)
    assert first["directory"] == cache
    assert first["xla_caches"] == "none"  # XLA's own GPU caches cannot write to gs://
    assert first["requests"] >= 1 and first["hits"] == 0 and first["stored"] == first["requests"]
    stored = sorted(bucket.find(cache.removeprefix("gs://")))
    assert len(stored) == first["stored"] and all(name.endswith("-cache") for name in stored)

    # A host replacing a preempted one, on the --multihost default: everything loads, nothing compiles.
    second = run_process(None, gcs_workdir, True, env)
    assert second["directory"] == cache
    assert second["requests"] == first["requests"] == second["hits"] and second["stored"] == 0
    assert sorted(bucket.find(cache.removeprefix("gs://"))) == stored
