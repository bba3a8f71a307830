"""Hugging Face Marian model directories on disk: read one (to import), write one (to export).

A directory holds `config.json`, `model.safetensors` (or an older `pytorch_model.bin`), `source.spm`,
`target.spm`, `vocab.json`, `tokenizer_config.json` and `generation_config.json`: what
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` read. Weights are read and written with
`safetensors` alone; only a `pytorch_model.bin` needs torch. Both come with the `hf` extra.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from transformer_jax.base.files import directory_written_whole
from transformer_jax.data.marian_vocabulary import MarianVocabulary
from transformer_jax.errors import ConfigError
from transformer_jax.export.marian import export_rows, generation_config_of, hf_config_of, ours_to_marian
from transformer_jax.model.stacks import unscanned_layout

NEEDED = ("config.json", "source.spm", "target.spm", "vocab.json")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid JSON ({str(error).splitlines()[0]}); restore the file") from None


def _first(value: Any) -> int:
    return int(value[0] if isinstance(value, list) else value)


def _read_tensors(directory: str) -> dict[str, np.ndarray]:
    safetensors_path, torch_path = (os.path.join(directory, name) for name in WEIGHTS)
    try:
        if os.path.isfile(safetensors_path):
            from safetensors.numpy import load_file

            return load_file(safetensors_path)
        import torch

        state = torch.load(torch_path, map_location="cpu", weights_only=True)
        return {name: value.float().numpy() for name, value in state.items()}
    except ImportError as error:
        raise ConfigError(f"reading {directory} needs the {error.name} package; install it with "
                          "pip install 'transformer-jax[hf]'") from None
    except Exception as error:  # a damaged file: safetensors' and torch's own errors differ by version
        raise ConfigError(f"the weights in {directory} cannot be read ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); download the model again") from None


def read_marian(directory: str) -> tuple[dict[str, Any], dict[str, np.ndarray], MarianVocabulary]:
    """(config.json, the state dict as NumPy (names without the leading "model."), the vocabulary) of a local
    Hugging Face Marian directory.

    ConfigError, naming the directory and what is wrong, when it is not one or its parts disagree.
    """
    if not os.path.isdir(directory):
        raise ConfigError(f"{directory} is not a directory; pass a local Hugging Face Marian model directory "
                          "(save_pretrained's, or a downloaded Helsinki-NLP/opus-mt-* snapshot)")
    missing = [name for name in NEEDED if not os.path.isfile(os.path.join(directory, name))]
    if not any(os.path.isfile(os.path.join(directory, name)) for name in WEIGHTS):
        missing.append(" or ".join(WEIGHTS))
    if missing:
        raise ConfigError(f"{directory} is not a Marian checkpoint: it lacks {', '.join(missing)}")
    config = _read_json(os.path.join(directory, "config.json"))
    if not isinstance(config, dict) or config.get("model_type") != "marian":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise ConfigError(f"{directory} holds a {kind!r} model, not a Marian one (model_type 'marian')")
    vocab = _read_json(os.path.join(directory, "vocab.json"))
    target_path = os.path.join(directory, "target_vocab.json")
    target_vocab = _read_json(target_path) if os.path.isfile(target_path) else None
    if target_vocab is not None and (not isinstance(target_vocab, dict) or len(target_vocab) != len(vocab)):
        raise ConfigError(f"{directory} has source and target vocabularies of different sizes, which transformer_jax "
                          "does not support (its model has one vocabulary size)")
    tokenizer_config = os.path.join(directory, "tokenizer_config.json")
    unk_piece = _read_json(tokenizer_config).get("unk_token", "<unk>") if os.path.isfile(tokenizer_config) else "<unk>"
    if not isinstance(vocab, dict) or unk_piece not in vocab:
        raise ConfigError(f"{directory}/vocab.json is not a Marian vocabulary (no {unk_piece!r} piece)")
    special = {"pad": _first(config["pad_token_id"]), "unk": int(vocab[unk_piece]),
               "eos": _first(config["eos_token_id"]), "decoder_start": _first(config["decoder_start_token_id"])}
    files = [open(os.path.join(directory, name), "rb").read() for name in ("source.spm", "target.spm")]
    try:
        vocabulary = MarianVocabulary(files[0], files[1], vocab, special, target_vocab)
    except (RuntimeError, Exception) as error:  # SentencePiece's parse error, or the DataError of the table
        raise ConfigError(f"the vocabulary of {directory} cannot be used ({str(error).splitlines()[0]})") from None
    tensors = {name.removeprefix("model."): value for name, value in _read_tensors(directory).items()}
    if len(vocab) != config["vocab_size"]:
        raise ConfigError(f"{directory}/vocab.json has {len(vocab)} pieces but config.json a vocab_size of "
                          f"{config['vocab_size']}; the vocabulary does not belong to these weights")
    embedding = next((tensors[name] for name in ("shared.weight", "encoder.embed_tokens.weight") if name in tensors), None)
    if embedding is None or embedding.shape != (config["vocab_size"], config["d_model"]):
        shape = None if embedding is None else embedding.shape
        raise ConfigError(f"the embeddings of {directory} have shape {shape}, not (vocab_size, d_model) = "
                          f"{(config['vocab_size'], config['d_model'])} of its config.json")
    return config, tensors, vocabulary


def check_new_directory(directory: str) -> None:
    """ConfigError unless `directory` is absent or an empty directory (nothing is ever written over)."""
    if not directory.strip():  # "" would be the current directory
        raise ConfigError("the directory to write is an empty path; name a new directory")
    if os.path.isfile(directory) or (os.path.isdir(directory) and os.listdir(directory)):
        raise ConfigError(f"{directory} already exists and is not empty; choose a new directory or remove it")


def write_directory(directory: str, files: Mapping[str, bytes]) -> str:
    """Write `files` ({name: content}) as the local `directory` (checked by export_target), whole or not at all."""
    with directory_written_whole(directory) as staging:
        for name, content in files.items():
            with open(os.path.join(staging, name), "wb") as f:
                f.write(content)
    return os.path.normpath(directory)


def safetensors_bytes(tensors: Mapping[str, np.ndarray]) -> bytes:
    """The state dict as a `model.safetensors` file (format "pt", as transformers expects)."""
    try:
        from safetensors.numpy import save
    except ImportError:
        raise ConfigError("exporting to Hugging Face needs the safetensors package; install it with "
                          "pip install 'transformer-jax[hf]'") from None
    return save({name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()},
                metadata={"format": "pt"})


def json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def marian_files(params: Any, config: Any, tokenizer: Any, source_lang: str, target_lang: str, beam_size: int,
                 tokenizer_file: bytes) -> dict[str, bytes]:
    """The files of a Hugging Face Marian directory holding `params` ({name: content}); `tokenizer_file` is the
    run's tokenizer.model (a SentencePiece model serves as both source.spm and target.spm)."""
    rows = export_rows(config.vocab_size)
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), unscanned_layout(nn.meta.unbox(params)))
    tensors = ours_to_marian(params, config, rows)
    separate = isinstance(tokenizer, MarianVocabulary) and tokenizer.separate
    tables = {}
    for name, target in (("vocab.json", False), ("target_vocab.json", True))[:1 + separate]:
        pieces = ["</s>", "<unk>"] + [tokenizer.piece(int(i), target=target) for i in rows[2:-1]] + ["<pad>"]
        if len(set(pieces)) != len(pieces):
            raise ConfigError("the tokenizer names two ids with one piece; a Marian vocabulary cannot hold it")
        tables[name] = json_bytes({piece: index for index, piece in enumerate(pieces)})
    if isinstance(tokenizer, MarianVocabulary):
        source_spm, target_spm = tokenizer.files["source.spm"], tokenizer.files["target.spm"]
    else:
        source_spm = target_spm = tokenizer_file
    hf_config = hf_config_of(config, len(rows))
    tokenizer_config = {"tokenizer_class": "MarianTokenizer", "source_lang": source_lang, "target_lang": target_lang,
                        "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
                        "model_max_length": config.max_len, "separate_vocabs": separate}
    return {"config.json": json_bytes(hf_config), "model.safetensors": safetensors_bytes(tensors),
            "generation_config.json": json_bytes(generation_config_of(hf_config, beam_size)),
            **tables, "tokenizer_config.json": json_bytes(tokenizer_config), "source.spm": source_spm, "target.spm": target_spm}
