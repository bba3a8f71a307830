"""JAX's persistent compilation cache for train.py and eval.py: a program compiled once is loaded after.

Evaluating a split compiles one beam-search program per batch shape (about 2 s each on 2 CPU cores,
half of a small model's test-set translation); training compiles its step and its dev evaluations.
With the cache, a later run of the same shapes (eval.py after train.py, another checkpoint, a resumed
run) loads them instead. Where it lives, by `--compilation_cache`:

  (not given)  $JAX_COMPILATION_CACHE_DIR if set; else, with --multihost, the workdir's cache (below);
               else $XDG_CACHE_HOME/transformer_jax/xla (~/.cache/...)
  workdir      <workdir>/compilation_cache (base/workdir.py's COMPILATION_CACHE), local or gs://
               (a directory named workdir: ./workdir)
  DIR          this directory, local or a gs:// URL (JAX reaches it through etils.epath and gcsfs)
  (empty)      off

Multi-process runs default to the workdir because a preempted VM comes back with an empty disk, and
because JAX stores programs from process 0 only (every process reads): a cache on each host's own disk
would stay empty on all hosts but process 0's. In the workdir, every process, and every host that
replaces a preempted one, loads what process 0 compiled.

Programs that compile in under a second are not stored (JAX's jax_persistent_cache_min_compile_time_secs,
left at its default): loading one costs a file read, a round trip on a bucket, that would save little.
Tests that need tiny programs stored set it to 0.
"""

from __future__ import annotations

import os

import jax

from transformer_jax.base import workdir as layout
from transformer_jax.errors import ConfigError

WORKDIR_CHOICE = "workdir"  # --compilation_cache=workdir: <workdir>/compilation_cache


def default_cache_dir() -> str:
    """$JAX_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME (default ~/.cache)/transformer_jax/xla."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "transformer_jax", "xla")


def compilation_cache_dir(choice: str | None, workdir: str, multihost: bool) -> str:
    """The directory `--compilation_cache=choice` (None: not given) names for a run in `workdir`; '' = off."""
    if choice is None:
        if os.environ.get("JAX_COMPILATION_CACHE_DIR") or not multihost:
            return default_cache_dir()
        choice = WORKDIR_CHOICE
    if choice == WORKDIR_CHOICE:
        return layout.run_path(workdir, layout.COMPILATION_CACHE)
    return choice


def is_remote(directory: str) -> bool:
    """Whether `directory` is a URL of a remote file system (gs://...), as JAX's cache tells them apart."""
    return "://" in directory and not directory.startswith("file://")


def use_compilation_cache(choice: str | None, workdir: str, multihost: bool = False) -> str:
    """Load and store compiled programs where `--compilation_cache=choice` says (compilation_cache_dir);
    returns that directory ('' leaves JAX's cache off)."""
    directory = compilation_cache_dir(choice, workdir, multihost)
    if directory and not is_remote(directory) and os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(f"the compilation cache {directory} is not a directory; pass --compilation_cache=DIR "
                          "naming a directory (made if missing), or --compilation_cache= to turn it off")
    jax.config.update("jax_compilation_cache_dir", directory or None)
    if is_remote(directory) and "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES" not in os.environ:
        # JAX puts XLA's GPU autotuning cache inside the cache directory, and XLA's C++ file layer has no
        # gs:// scheme: the first GPU compile would fail. On a cache hit no autotuning runs anyway.
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    return directory
