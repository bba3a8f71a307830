"""Translating text with a trained run, from Python: load the run once, then translate sentences (a str or a list).

    from transformer_jax.evaluation import Translator

    with Translator("runs/demo") as translator:          # ours, or an imported OPUS-MT run
        translator.translate(["the dog sleeps .", "the house"])                  # beam search, the run's settings
        translator.translate("the dog sleeps .")                                 # one sentence: one string back
        translator.translate(lines, mode="sample", top_k=10, seed=1)             # back-translation's sampling

Sentences are sorted by length internally and cut into token-budget batches (on accelerators sized for the
devices, `batching_for`; on CPUs the run's eval.batch_tokens, else batches of data.eval_batch_size), each batch's
rows split over this process's devices (sampling runs on one
device: its draws depend on a row's place); the translations come back in the caller's order, one line each.
An empty string gives an empty translation; a sentence longer than the model's max_len is cut to it (counted in
`truncated`).

Every argument is used or refused: a wrong type or value (a workdir of None, `devices=[]`, `batch_size=0`, an
item that is not text, a lone surrogate in a sentence) is one of the project's errors (`errors.UserError`: a
ConfigError, DataError or CheckpointError) naming the argument and the fix, raised before any work. Opening a
run that is still training: a checkpoint named as latest, best or average that the run rotates away while it is
read is read again at the run's newest (a few times); a step named by its number is a CorruptCheckpointError
saying it was rotated away, as the command line says it.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import sys
from collections.abc import Iterable, Mapping, Set
from typing import Any, Sequence, overload

import jax

from transformer_jax.base.sharding import make_mesh
from transformer_jax.checkpoints.integrity import state_checksums
from transformer_jax.checkpoints.saved_run import Run, open_run
from transformer_jax.checkpoints.selection import checkpoint_params, select_steps
from transformer_jax.config.schema import decode_options, decoding_dtype, translation_batching
from transformer_jax.data.encoded import encode_pairs
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.translate import DTYPES
from transformer_jax.errors import ConfigError, CorruptCheckpointError
from transformer_jax.evaluation.device_batches import sized_batching
from transformer_jax.evaluation.text_translation import check_texts, replicate, translate_encoded

# Reads of a checkpoint named as latest, best or average, each at the run's newest, when the run writing it rotates
# the one being read away (it saves every training.checkpoint_every steps: the next read normally succeeds).
ROTATION_TRIES = 3


class Translator:
    """A run's model, loaded once, translating a sentence or a list of them (`translate`).

    Args:
      workdir: a training run's directory, or one `transformer-jax import` wrote.
      checkpoint: latest, best, a step (300 or "300"), average:N or average, as --checkpoint takes them (see
        `checkpoints.select_steps`).
      dtype: "float32" or "bfloat16" (default: the run's eval.dtype, else the model's).
      devices: the devices that split each batch's rows (default: this process's).
    """

    def __init__(self, workdir: str | os.PathLike, checkpoint: str | int = "latest", *, dtype: str | None = None,
                 devices: Sequence[jax.Device] | None = None) -> None:
        if not isinstance(workdir, (str, os.PathLike)):
            raise ConfigError(f"Translator(workdir={workdir!r}): workdir is the directory of a training run (a str or "
                              f"a path), not {type(workdir).__name__}; pass the --workdir a training run wrote")
        if dtype is not None and dtype not in DTYPES:
            named = [name for name in DTYPES if name]
            raise ConfigError(f"Translator(dtype={dtype!r}) is not one of {named} ('' the model's own dtype); pass one "
                              "of them, or leave it out for the run's eval.dtype")
        mesh = make_mesh(devices=_devices(devices))  # checked before the run is opened
        self.run: Run = open_run(os.fspath(workdir))
        try:
            self.steps, params = _newest_params(self.run, checkpoint)
            self.mesh = mesh
            self.params = replicate(params, self.mesh)
        except BaseException:
            self.close()  # a refused checkpoint leaves no manager open
            raise
        self.dtype = decoding_dtype(self.run.config) if dtype is None else dtype
        # None: sized for the devices per search (`batching_for`); set a TranslationBatching to choose one.
        self.batching: TranslationBatching | None = None
        self.options = decode_options(self.run.config)
        self.truncated = 0  # sentences cut to the model's max_len, over every call
        self._said: set[str] = set()  # the sized batchings already said

    def search(self, **settings: Any) -> DecodeOptions:
        """The run's search settings with `settings` (DecodeOptions' fields; None keeps the run's) applied; a setting
        of another mode than the one that runs (top_k without mode="sample") is refused, as the command line does."""
        return self.options.override(settings)

    @overload
    def translate(self, texts: str, *, batch_size: int | None = None, batch_tokens: int | None = None,
                  **settings: Any) -> str: ...

    @overload
    def translate(self, texts: Sequence[str], *, batch_size: int | None = None, batch_tokens: int | None = None,
                  **settings: Any) -> list[str]: ...

    def translate(self, texts: str | Sequence[str], *, batch_size: int | None = None,
                  batch_tokens: int | None = None, **settings: Any) -> str | list[str]:
        """The translation of one sentence (a str gives a str), or of a sequence of sentences (a list, in their
        order). `settings`: mode, beam_size, alpha, max_extra_length, seed, temperature, top_k, top_p
        (DecodeOptions; each for its mode, see `search`); `batch_size` and `batch_tokens` (TranslationBatching's,
        within the limits it declares; 0 tokens: batches of batch_size sentences) override the run's batching. Every
        argument is checked before any sentence is translated, an empty list's too: a refused setting or batch is a
        ConfigError; an item that is not a str a ConfigError, a str with a lone surrogate a DataError, each naming
        the item (texts[3])."""
        if isinstance(texts, str):
            return self.translate([texts], batch_size=batch_size, batch_tokens=batch_tokens, **settings)[0]
        texts = _sentences(texts)
        options = self.search(**settings)
        TranslationBatching().replace(batch_size=batch_size, batch_tokens=batch_tokens)  # refuses 0, -1, 2.5, True
        check_texts(texts, named="texts[{}]", first=0)
        if not texts:
            return []
        encoded = encode_pairs([(text, "") for text in texts], self.run.tokenizer)
        self.truncated += int((encoded.source.lengths > self.run.model_config.max_len).sum())
        batching = self.batching_for(options)
        rows = max(1, min(len(texts), batching.batch_size))  # a few sentences: a batch of their size
        batching = batching.replace(batch_size=rows).replace(batch_size=batch_size, batch_tokens=batch_tokens)
        return translate_encoded(self.params, self.run.model_config, encoded, self.run.tokenizer, options,
                                 batching=batching, dtype=self.dtype, show_progress=False, mesh=self.mesh)

    def batching_for(self, options: DecodeOptions) -> TranslationBatching:
        """The batching a search of `options` runs in when no batch is given: `batching` when set, else sized for
        this Translator's devices on accelerators (said once per search, on standard error), else the run's eval
        batching (CPUs; see evaluation/device_batches.py)."""
        if self.batching is not None:
            return self.batching
        batching, line = sized_batching(translation_batching(self.run.config), self.run.model_config, options,
                                        self.dtype, self.mesh)
        if line and line not in self._said and jax.process_index() == 0:
            self._said.add(line)
            print(line, file=sys.stderr, flush=True)
        return batching

    def fingerprint(self) -> str:
        """A name of the model that translates: its tokenizer and every parameter's checksum. Two runs, or one run
        whose checkpoint was replaced, have the same fingerprint only if they translate alike."""
        sums = state_checksums(self.params, weights=1)  # version 1: the fingerprints of outputs already made
        named = json.dumps({"tokenizer": self.run.tokenizer.fingerprint, "params": sorted(sums.items())})
        return hashlib.sha256(named.encode()).hexdigest()[:16]

    def close(self) -> None:
        """Close the run's checkpoint manager."""
        self.run.checkpointer.close()

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _devices(devices: Sequence[jax.Device] | None) -> list[jax.Device]:
    """`devices` checked (ConfigError: none, one that is not a jax.Device of this process, one given twice), or this
    process's devices when None."""
    if devices is None:
        return list(jax.local_devices())
    if isinstance(devices, jax.Device) or not isinstance(devices, Iterable):
        raise ConfigError(f"Translator(devices={devices!r}) takes a list of devices; pass [device] for one, or leave "
                          "it out for this process's devices")
    devices = list(devices)
    local = jax.local_devices()
    for device in devices:
        if not isinstance(device, jax.Device) or device not in local:
            raise ConfigError(f"Translator(devices=...) holds {device!r}, which is not a device of this process; pass "
                              f"some of jax.local_devices() ({len(local)} here)")
    if not devices:
        raise ConfigError("Translator(devices=[]) names no device to translate on; pass some of jax.local_devices(), "
                          "or leave devices out for all of them")
    if len(set(devices)) < len(devices):
        raise ConfigError("Translator(devices=...) names a device twice; pass each once")
    return devices


def _sentences(texts: Any) -> list[str]:
    """`translate`'s sentences as a list (any sequence or iterable of them, in its order); ConfigError for what is
    no sequence of sentences: None, a number, bytes (undecoded), a dict or a set (no order to answer in)."""
    if isinstance(texts, (bytes, bytearray, memoryview)):
        raise ConfigError(f"translate() takes text, not {type(texts).__name__}; decode it first "
                          "(e.g. texts.decode('utf-8'))")
    if isinstance(texts, (Mapping, Set)) or not isinstance(texts, Iterable):
        order = " (its order is not defined)" if isinstance(texts, (Mapping, Set)) else ""
        raise ConfigError(f"translate() takes a str or a sequence of str, not {type(texts).__name__}{order}; pass "
                          "a sentence or a list of them")
    return list(texts)


def _newest_params(run: Run, checkpoint: str | int) -> tuple[list[int], Any]:
    """The steps `checkpoint` names and their parameters. A step the run writing it rotates away while it is read
    (gone from the listing once the read failed) is chosen again, when `checkpoint` names it by its place (latest,
    best, average): the user asked for the run's newest, which a retry gives; a step named by its number is gone
    and stays the CorruptCheckpointError saying so (`Checkpointer.restore_params`)."""
    by_place = not isinstance(checkpoint, numbers.Integral) and not str(checkpoint).isdigit()
    attempt = 1
    while True:
        steps = select_steps(run.checkpointer, checkpoint, run.config.eval.average_last)
        try:
            return steps, checkpoint_params(run, steps)
        except CorruptCheckpointError:
            if not by_place or attempt == ROTATION_TRIES or set(steps) <= set(run.checkpointer.steps()):
                raise  # damaged, not rotated away (or rotated away at every try)
        attempt += 1
