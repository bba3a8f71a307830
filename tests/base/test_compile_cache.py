"""The persistent compilation cache train.py and eval.py turn on: where it lives, and that it is used."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.base.compile_cache import default_cache_dir, use_compilation_cache


def test_the_cache_lives_under_xdg_cache_home_unless_jax_is_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == os.path.join(str(tmp_path), "transformer_jax", "xla")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/else")
    assert default_cache_dir() == "/somewhere/else"


@pytest.fixture
def restore_cache_settings():
    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_a_compiled_program_is_stored_and_an_empty_directory_turns_the_cache_off(tmp_path, restore_cache_settings):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # store even this small program
    use_compilation_cache(str(tmp_path / "xla"))
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
    assert os.listdir(tmp_path / "xla")  # one entry (at least) for the program just compiled
    use_compilation_cache("")
    assert jax.config.jax_compilation_cache_dir is None
