"""transformer-jax preflight --config=CONFIG --topology=v5e:16x16 [--num_slices=N] [--config.KEY=VALUE ...]

Compiles the run's train step, dev-loss step and search (beam search by default) for the topology (libtpu: the `tpu`
extra; GPUs such as --topology=h100-8: JAX's CUDA plugin, `pip install "jax[cuda12]==<jax version>"`),
prints per-device memory against the chip's HBM, FLOPs, collectives and a roofline speed (of training, and of
translating: sentences/s and the hours for 100M sentences; --search_width adds a bulk job's typical batch),
and ends with "fits" (exit 0) or a "does not fit" line naming what to change (exit 1).

The --search_width batch is `transformer-jax translate-corpus`'s, priced with the same search flags (--mode=greedy,
--mode=sample --top_k=10, --dtype=bfloat16, --batch_size=512 --batch_tokens=16384, ...; by default the run's beam
search and batching) over one host process's devices (as libtpu lays the topology out in hosts), as each process of
a bulk job translates its own shards.
"""

import dataclasses
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # only compile-only devices are used; never a local accelerator
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # the CUDA plugin's library checks want a GPU

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer_jax.cli import define_search_flags, refuse_blank, user_errors  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Run config file (see configs/); --config_help lists every key.", lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU topology (v5e:16x16, v4:4x4x4, ...), Cloud type (v5e-256) "
                                "or GPUs of one host (h100, h100-8, h200, h200-8).")
_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices joined by the data-center network (multi-slice).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Compile for the batch shapes this run directory's corpus gives, as train.py will (its "
    "corpus is prepared there, as train.py would, or reused; --config.data.prepared=DIR needs no workdir); "
    "without a corpus, rows of data.max_length.")
_SEARCH_WIDTH = flags.DEFINE_integer(
    "search_width", 0, "Also compile translate-corpus's search for sources padded to this many tokens (a bulk job's "
    "typical batch: it sorts sentences by length; e.g. 32), with the search flags below (default: the run's beam "
    "search and translation batching), over one host process's devices, and print the job's sentences/s and the "
    "hours for 100M sentences.")
_SEARCH = define_search_flags()
_HBM_GB = flags.DEFINE_float("hbm_gb", None, "Memory per device in GB instead of the chip's (e.g. to keep headroom).")
flags.mark_flags_as_required(["config", "topology"])
refuse_blank(_WORKDIR, "the run directory whose corpus to compile for, or leave it out")


def main(argv: list[str]) -> None:
    del argv
    with user_errors():
        import jax

        # The environment default above comes too late when `python -m` has imported jax with the package:
        # set the platform before any backend starts, so an installed CUDA plugin is only compiled for.
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS") or "cpu")
        from transformer_jax.aot.plan import BulkSearch, plan_run
        from transformer_jax.base import exists
        from transformer_jax.errors import ConfigError

        if not _TOPOLOGY.value.strip():
            raise ConfigError("--topology is empty; name one, e.g. --topology=v5e:2x4, v5e-256, v5p-128 or h100-8")
        if _WORKDIR.value is not None and not exists(_WORKDIR.value):  # a mistyped path must not become a workdir
            raise ConfigError(f"--workdir={_WORKDIR.value} does not exist; the preflight reads (or prepares) the "
                              "corpus of an existing run directory: fix the path, or create the new run's directory "
                              f"first (mkdir -p {_WORKDIR.value})")
        if _HBM_GB.value is not None and not 0 < _HBM_GB.value < float("inf"):
            raise ConfigError(f"--hbm_gb={_HBM_GB.value} must be a positive number of GB per device "
                              "(leave it out to use the chip's own memory)")

        holders = (getattr(_SEARCH, field.name) for field in dataclasses.fields(_SEARCH))
        given = [holder.name for holder in holders if holder is not None and holder.value is not None]
        if given and not _SEARCH_WIDTH.value:
            raise ConfigError(f"--{given[0]} prices translate-corpus's batch, which needs --search_width: add "
                              "--search_width=32 (sources padded to 32 tokens, a bulk job's typical batch)")
        config = _CONFIG.value
        bulk = BulkSearch(_SEARCH.options(config), **_SEARCH.translation(config))
        report, fits = plan_run(config, _TOPOLOGY.value, _SLICES.value,
                                None if _HBM_GB.value is None else int(_HBM_GB.value * 1e9), _WORKDIR.value,
                                _SEARCH_WIDTH.value, bulk)
        print(report)
        if not fits:
            sys.exit(1)
