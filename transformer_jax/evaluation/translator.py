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
"""

from __future__ import annotations

import hashlib
import json
import sys
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
from transformer_jax.errors import ConfigError
from transformer_jax.evaluation.device_batches import sized_batching
from transformer_jax.evaluation.text_translation import replicate, translate_encoded


class Translator:
    """A run's model, loaded once, translating a sentence or a list of them (`translate`).

    Args:
      workdir: a training run's directory, or one `transformer-jax import` wrote.
      checkpoint: latest, best, a step (300 or "300"), average:N or average, as --checkpoint takes them (see
        `checkpoints.select_steps`).
      dtype: "float32" or "bfloat16" (default: the run's eval.dtype, else the model's).
      devices: the devices that split each batch's rows (default: this process's).
    """

    def __init__(self, workdir: str, checkpoint: str | int = "latest", *, dtype: str | None = None,
                 devices: Sequence[jax.Device] | None = None) -> None:
        self.run: Run = open_run(workdir)
        try:
            self.steps = select_steps(self.run.checkpointer, checkpoint, self.run.config.eval.average_last)
            self.mesh = make_mesh(devices=list(devices or jax.local_devices()))
            self.params = replicate(checkpoint_params(self.run, self.steps), self.mesh)
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
        (DecodeOptions; each for its mode, see `search`); `batch_size` and `batch_tokens` override the run's
        batching. A setting is checked before any sentence is: a refused one is a ConfigError."""
        if isinstance(texts, str):
            return self.translate([texts], batch_size=batch_size, batch_tokens=batch_tokens, **settings)[0]
        texts = list(texts)
        options = self.search(**settings)
        if not all(isinstance(text, str) for text in texts):
            kind = next(type(text).__name__ for text in texts if not isinstance(text, str))
            raise ConfigError(f"translate() takes a str or a sequence of str, and one item is of type {kind}; "
                              "pass text")
        if not texts:
            return []
        encoded = encode_pairs([(text, "") for text in texts], self.run.tokenizer)
        self.truncated += int((encoded.source.lengths > self.run.model_config.max_len).sum())
        batching = self.batching_for(options)
        rows = max(1, min(len(texts), batching.batch_size))  # a few sentences: a batch of their size
        batching = batching.replace(batch_size=batch_size or rows, batch_tokens=batch_tokens)
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
        sums = state_checksums(self.params)
        named = json.dumps({"tokenizer": self.run.tokenizer.fingerprint, "params": sorted(sums.items())})
        return hashlib.sha256(named.encode()).hexdigest()[:16]

    def close(self) -> None:
        """Close the run's checkpoint manager."""
        self.run.checkpointer.close()

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

