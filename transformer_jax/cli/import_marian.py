"""transformer-jax import --hf_dir=opus-mt-en-de --workdir=runs/opus_en_de [--source_lang=en --target_lang=de]
                       [--text_data=DIR]        (also python -m transformer_jax.cli.import_marian, the same flags)

Imports a Hugging Face Marian (OPUS-MT) model as a run directory that the other commands use.
The run directory gets config.json (the model's settings; data.source "text" reading --text_data, whose
test.<lang> and dev.<lang> files `transformer-jax score --split` then scores), tokenizer.model (the Marian vocabulary,
data/marian_vocabulary.py) and checkpoints/0 (the parameters, export/marian.py). It is written whole into a
folder beside --workdir and renamed once complete (base.files.directory_written_whole); --workdir must be
absent or empty.

Then: `transformer-jax translate --workdir=DIR --input=FILE`, `transformer-jax score --workdir=DIR --split=test`,
and fine-tuning with `transformer-jax train --config=... --workdir=NEW --config.training.init_from=DIR`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any

import flax.struct
import ml_collections
import numpy as np
from absl import flags

from transformer_jax.base import directory_written_whole, quiet_console, write_atomically
from transformer_jax.base import workdir as layout
from transformer_jax.checkpoints import Checkpointer
from transformer_jax.cli.flag_parsing import refuse_blank
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.stops import run_command
from transformer_jax.config import check_run_config, default_config, write_run_config
from transformer_jax.data import MarianVocabulary
from transformer_jax.errors import ConfigError
from transformer_jax.export import check_new_directory, marian_to_ours, model_config_of, read_marian
from transformer_jax.model import TransformerConfig


@flax.struct.dataclass
class ModelOnly:
    """What an imported checkpoint holds: the parameters (eval.py and training.init_from read only those)."""

    params: Any


def run_config(model: TransformerConfig, vocabulary: MarianVocabulary, source_lang: str, target_lang: str,
               text_data: str) -> ml_collections.ConfigDict:
    """The imported run's settings: the model's, its vocabulary's size, and a text corpus to score on."""
    config = default_config()
    config.model.update({**dataclasses.asdict(model), "vocab_size": 0})
    config.data.vocab_size = vocabulary.vocab_size
    config.data.max_length = min(config.data.max_length, model.max_len - 1)
    config.data.source, config.data.path = "text", text_data
    config.data.source_lang, config.data.target_lang = source_lang, target_lang
    config.training.num_train_steps = 1  # a run that is already trained: nothing for train.py to do here
    check_run_config(config)
    return config


def local_model_directory(hf_dir: str) -> str:
    """`hf_dir` itself when it is a directory; for a Hugging Face model id ("Helsinki-NLP/opus-mt-en-de"), its
    snapshot in this machine's Hugging Face cache (`hf download ID` put it there). Nothing is downloaded: an id
    that is not cached is a ConfigError saying how to fetch it."""
    if os.path.isdir(hf_dir) or os.path.exists(hf_dir) or hf_dir.count("/") != 1 or hf_dir.startswith((".", "/")):
        return hf_dir  # a path: read_marian says what is wrong with it
    try:
        import huggingface_hub
    except ImportError:
        raise ConfigError(f"--hf_dir={hf_dir} is not a directory; as a Hugging Face model id it needs "
                          "huggingface_hub (pip install 'transformer_jax[hf]'), or pass the model's "
                          "directory") from None
    try:
        return huggingface_hub.snapshot_download(repo_id=hf_dir, local_files_only=True)
    except (huggingface_hub.errors.LocalEntryNotFoundError, huggingface_hub.errors.HFValidationError, OSError):
        raise ConfigError(f"--hf_dir={hf_dir} is not a directory, and this machine's Hugging Face cache holds no "
                          f"snapshot of that model id; fetch it first (hf download {hf_dir}), or pass the model's "
                          "directory") from None


def import_marian(hf_dir: str, workdir: str, source_lang: str = "en", target_lang: str = "de",
                  text_data: str = "") -> str:
    """Write the run directory `workdir` from the Marian model in `hf_dir` (a directory, or a model id in the
    local Hugging Face cache: local_model_directory); returns `workdir`."""
    check_new_directory(workdir)
    hf_dir = local_model_directory(hf_dir)
    hf_config, tensors, vocabulary = read_marian(hf_dir)
    model = model_config_of(hf_config, tensors)
    params = marian_to_ours(tensors, model, vocabulary.marian_ids)
    config = run_config(model, vocabulary, source_lang, target_lang, os.path.abspath(text_data) if text_data else "")
    with directory_written_whole(workdir) as staging:
        write_atomically(layout.run_path(staging, layout.TOKENIZER), vocabulary.to_bytes())
        write_run_config(config, staging)
        checkpointer = Checkpointer(layout.run_path(staging, layout.CHECKPOINTS), asynchronous=False)
        checkpointer.save(0, ModelOnly(params=_as_arrays(params)), {}, {"imported_from": os.path.abspath(hf_dir)})
        checkpointer.close()
    return os.path.normpath(workdir)


def _as_arrays(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _as_arrays(value) for key, value in tree.items()}
    return np.asarray(tree, np.float32)


_HF_DIR = flags.DEFINE_string("hf_dir", None, "A local Hugging Face Marian model directory, or a model id "
                              "(Helsinki-NLP/opus-mt-en-de) whose snapshot `hf download` put in the local cache.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The run directory to create (absent or empty).")
_SOURCE = flags.DEFINE_string("source_lang", "en", "Source language code (the text files' suffix).")
_TARGET = flags.DEFINE_string("target_lang", "de", "Target language code.")
_TEXT = flags.DEFINE_string("text_data", "", "Directory of dev/test.<lang> files eval.py --split scores (optional).")
flags.mark_flags_as_required(["hf_dir", "workdir"])
refuse_blank(_HF_DIR, "a local Hugging Face Marian model directory, or a model id (Helsinki-NLP/opus-mt-en-de)")
refuse_blank(_WORKDIR, "the run directory to create (absent or empty)")
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _HF_DIR


def main(argv: list[str]) -> None:
    del argv
    quiet_console()
    with user_errors():
        workdir = import_marian(_HF_DIR.value, _WORKDIR.value, _SOURCE.value, _TARGET.value, _TEXT.value)
        command = shlex.join(["transformer-jax", "translate", f"--workdir={workdir}"])
        print(f"imported {_HF_DIR.value} into {workdir}: {command} --input=FILE translates with it")


if __name__ == "__main__":
    run_command(main)
