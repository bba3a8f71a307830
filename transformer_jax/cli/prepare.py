"""transformer-jax prepare --config=CONFIG --output=DIR [--workers=N] [--config.KEY=VALUE ...]

Prepares the config's training corpus once, on one machine, before the run (a pod need not exist yet):
trains the tokenizer, encodes the training split into token shards with N worker processes and writes
the length index and the dev/test text to DIR (a local directory or gs://bucket/path). Then every
process of the run reads only the pairs of its own rows:

  transformer-jax train --config=CONFIG --workdir=RUN --config.data.prepared=DIR

One job prepares an output at a time (`<DIR>.lock`, as a run owns its workdir): another is refused in one line
naming it. A failed first attempt leaves no directory behind; a stop keeps what was made, and the same command
prepares the corpus anew. (Also `python -m transformer_jax.cli.prepare`, the same flags.)
"""

import contextlib
import os
import time
from typing import Iterator

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # preparing is host work: no accelerator is started

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer_jax.cli.flag_parsing import refuse_blank  # noqa: E402
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
        from transformer_jax.data import prepare_corpus
        from transformer_jax.errors import ConfigError

        config, output = _CONFIG.value, _OUTPUT.value
        check_run_config(config)
        if _WORKERS.value < 1:
            raise ConfigError(f"--workers={_WORKERS.value} must be at least 1")
        start = time.perf_counter()
        with writes_permitted(output):  # claimed while prepared; a failed first attempt leaves no directory
            corpus = prepare_corpus(config, output, workers=_WORKERS.value, workers_flag="--workers",
                                    output_flag="--output")
        seconds = time.perf_counter() - start
        print(f"prepared {len(corpus)} training pairs in {len(corpus.manifest['shards'])} shard(s) at "
              f"{output} ({seconds:.1f} s); train with --config.data.prepared={output}")


@contextlib.contextmanager
def writes_permitted(output: str) -> Iterator[None]:
    """A write for `output` (into it, its lock beside it, or a folder made for it) that the file system does not
    permit (EPERM: an immutable directory; EACCES: another user's) becomes one StorageError line naming the folder
    and the fix; any other PermissionError keeps its traceback."""
    from transformer_jax.errors import StorageError

    try:
        yield
    except PermissionError as error:
        target = os.path.abspath(output.rstrip("/")) if "://" not in output else None
        name = os.path.abspath(error.filename) if isinstance(error.filename, str) else None
        if target is None or name is None or not (name == target or name.startswith((target + os.sep,
                                                                                     target + ".lock"))
                                                  or target.startswith(name + os.sep)):
            raise
        folder = os.path.dirname(name)
        raise StorageError(f"preparing the corpus at {output} failed: {(error.strerror or 'not permitted').lower()} "
                           f"in {folder} (an immutable directory, or another user's); make {folder} writable or "
                           "choose another --output, and run the same command again") from None


if __name__ == "__main__":
    run_command(main)
