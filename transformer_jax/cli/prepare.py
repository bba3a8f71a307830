"""transformer-jax prepare --config=CONFIG --output=DIR [--workers=N] [--config.KEY=VALUE ...]

Prepares the config's training corpus once, on one machine, before the run (a pod need not exist yet):
trains the tokenizer, encodes the training split into token shards with N worker processes and writes
the length index and the dev/test text to DIR (a local directory or gs://bucket/path). Then every
process of the run reads only the pairs of its own rows:

  transformer-jax train --config=CONFIG --workdir=RUN --config.data.prepared=DIR

(Also `python -m transformer_jax.cli.prepare`, the same flags.)
"""

import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # preparing is host work: no accelerator is started

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer_jax.cli.flag_parsing import refuse_blank  # noqa: E402
from transformer_jax.cli.run_directory import removed_on_failure  # noqa: E402
from transformer_jax.cli.user_errors import user_errors  # noqa: E402
from transformer_jax.cli.stops import interrupts_reported, run_command  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Run config file (see configs/); --config_help lists every key.", lock_config=True)
_OUTPUT = flags.DEFINE_string("output", None, "Directory to write the prepared corpus to (local or gs://).")
_WORKERS = flags.DEFINE_integer("workers", os.cpu_count() or 1, "Processes encoding the training shards.")
flags.mark_flags_as_required(["config", "output"])
refuse_blank(_OUTPUT, "the directory to prepare the corpus into (local or gs://)")


def main(argv: list[str]) -> None:
    del argv
    with user_errors(), interrupts_reported(lambda: "the corpus is not prepared (it has no manifest.json); "
                                            "the same command prepares it"):
        import jax

        # The environment default above comes too late when the package (and so jax) was imported first.
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS") or "cpu")
        from transformer_jax.config import check_run_config
        from transformer_jax.data import MANIFEST, prepare_corpus
        from transformer_jax.errors import ConfigError

        config = _CONFIG.value
        check_run_config(config)
        if _WORKERS.value < 1:
            raise ConfigError(f"--workers={_WORKERS.value} must be at least 1")
        start = time.perf_counter()
        with removed_on_failure(_OUTPUT.value, MANIFEST):  # a failed first attempt (a full disk) leaves no directory
            corpus = prepare_corpus(config, _OUTPUT.value, workers=_WORKERS.value, workers_flag="--workers")
        seconds = time.perf_counter() - start
        print(f"prepared {len(corpus)} training pairs in {len(corpus.manifest['shards'])} shard(s) at "
              f"{_OUTPUT.value} ({seconds:.1f} s); train with --config.data.prepared={_OUTPUT.value}")


if __name__ == "__main__":
    run_command(main)
