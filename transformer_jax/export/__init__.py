"""Exporting a trained model to other runtimes: CTranslate2, and Hugging Face Marian (MarianMTModel).

  export_target("ctranslate2" | "hf", DIR)   check the format, the directory and the runtime before any work
  export_run(run, params, target)    write the run's model (and its tokenizer) there
  export_ctranslate2(params, config, vocabulary, DIR)   the library call, for any parameters
  marian_files(params, config, tokenizer, ...)   a Marian directory's files (export/hf_directory.py, converted
                                                by export/marian.py; importing is cli/import_marian.py)

The runtimes' own packages (ctranslate2, safetensors) are imported only when exporting or importing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from transformer_jax.errors import ConfigError
from transformer_jax.export.ctranslate2 import check_output_directory, export_ctranslate2, import_ctranslate2
from transformer_jax.export.hf_directory import (
    check_new_directory,
    marian_files,
    read_marian,
    safetensors_bytes,
    write_directory,
)
from transformer_jax.export.marian import marian_to_ours, model_config_of

if TYPE_CHECKING:
    from transformer_jax.checkpoints.saved_run import Run

FORMATS = ("ctranslate2", "hf")


@dataclasses.dataclass(frozen=True)
class ExportTarget:
    """Where and as what to export: `format` (one of FORMATS) and a local output `directory`."""

    format: str
    directory: str


def export_target(fmt: str, directory: str) -> ExportTarget:
    """Check an export before any work: a ConfigError on an unknown format, a non-empty DIR or a missing runtime."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r} is unknown; choose one of {list(FORMATS)}")
    if not directory.strip():
        raise ConfigError("the export's --output directory is empty; pass the directory to write the model to")
    check_output_directory(directory)
    if fmt == "ctranslate2":
        import_ctranslate2()
    else:
        safetensors_bytes({})  # the hf extra is installed, or a ConfigError says how to install it
    return ExportTarget(fmt, directory)


def export_run(run: Run, params: Any, target: ExportTarget) -> str:
    """Write `params` of `run` as `target` asks, with the run's tokenizer beside it; returns the directory."""
    from transformer_jax.base import workdir as layout
    from transformer_jax.base.files import read_bytes

    tokenizer = run.tokenizer
    if target.format == "hf":
        files = marian_files(params, run.model_config, tokenizer, run.config.data.source_lang,
                             run.config.data.target_lang, run.config.eval.beam_size,
                             read_bytes(layout.run_path(run.workdir, layout.TOKENIZER)))
        return write_directory(target.directory, files)
    vocabulary = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
    tokenizer_model = read_bytes(layout.run_path(run.workdir, layout.TOKENIZER))
    return export_ctranslate2(params, run.model_config, vocabulary, target.directory,
                              extra_files={layout.TOKENIZER: tokenizer_model})


__all__ = [
    "FORMATS",
    "ExportTarget",
    "check_new_directory",
    "export_ctranslate2",
    "export_run",
    "export_target",
    "marian_files",
    "marian_to_ours",
    "model_config_of",
    "read_marian",
]
