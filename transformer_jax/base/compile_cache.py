"""JAX's persistent compilation cache for train.py and eval.py: a program compiled once is loaded after.

Evaluating a split compiles one beam-search program per batch shape (about 2 s each on 2 CPU cores,
half of a small model's test-set translation); training compiles its step and its dev evaluations.
With the cache, a later run of the same shapes (eval.py after train.py, another checkpoint, a resumed
run) loads them instead. Default place: $XDG_CACHE_HOME/transformer_jax/xla (~/.cache/...); JAX's own
JAX_COMPILATION_CACHE_DIR, when set, wins; `--compilation_cache=` (empty) turns it off.
"""

from __future__ import annotations

import os

import jax


def default_cache_dir() -> str:
    """$JAX_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME (default ~/.cache)/transformer_jax/xla."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "transformer_jax", "xla")


def use_compilation_cache(directory: str) -> None:
    """Load and store compiled programs under `directory` ('' leaves JAX's cache off)."""
    jax.config.update("jax_compilation_cache_dir", directory or None)
