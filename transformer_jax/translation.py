"""Translating whole dev/test sets: batching, decoding, detokenizing, and putting outputs back in order."""

from __future__ import annotations

import functools
import logging
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from transformer_jax.batching import eval_batches, restore_order
from transformer_jax.config import TransformerConfig
from transformer_jax.decode import translate_batch
from transformer_jax.evaluation import translation_scores
from transformer_jax.input_pipeline import EvalSet
from transformer_jax.tokenized import EncodedPairs
from transformer_jax.tokenizer import EOS_ID, Tokenizer


@functools.partial(jax.jit, static_argnames=("config", "mode", "beam_size", "max_extra_length", "top_k"))
def _translate(params: Any, src_tokens: jax.Array, rng: jax.Array, config: TransformerConfig, mode: str,
               beam_size: int, alpha: float, max_extra_length: int, temperature: float, top_k: int,
               top_p: float) -> jax.Array:
    options: dict[str, Any] = {"max_extra_length": max_extra_length}
    if mode == "beam":
        options.update(beam_size=beam_size, alpha=alpha)
    if mode == "sample":
        options.update(rng=rng, temperature=temperature, top_k=top_k, top_p=top_p)
    return translate_batch(params, config, src_tokens, mode=mode, **options)


def fit_to_model(src_BxS: np.ndarray, max_len: int) -> np.ndarray:
    """Cut source rows longer than the model's max_len (keeping their EOS), with a warning."""
    if src_BxS.shape[1] <= max_len:
        return src_BxS
    lengths = (src_BxS != 0).sum(1)
    if (lengths > max_len).any():
        logging.warning(
            "%d source sentence(s) longer than model.max_len=%d tokens are truncated for decoding",
            int((lengths > max_len).sum()), max_len,
        )
    cut = src_BxS[:, :max_len].copy()
    cut[lengths > max_len, max_len - 1] = EOS_ID
    return cut


def translate_encoded(
    params: Any,
    config: TransformerConfig,
    encoded: EncodedPairs,
    tokenizer: Tokenizer,
    *,
    batch_size: int = 64,
    mode: str = "beam",
    beam_size: int = 4,
    alpha: float = 0.6,
    max_extra_length: int = 50,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    show_progress: bool = True,
) -> list[str]:
    """Detokenized translations of every source sentence, in corpus order; empty sources give ''.

    Each translation is one line: a newline the tokenizer's byte pieces produce becomes a space.
    """
    rng = jax.random.key(seed)
    outputs: list[str] = []
    indices: list[int] = []
    with tqdm(total=len(encoded), unit="sent", desc="translate", disable=not show_progress) as progress:
        for batch in eval_batches(encoded, batch_size):
            src = fit_to_model(batch["inputs"], config.max_len)
            rng, key = jax.random.split(rng)
            ids = _translate(params, src, key, config, mode, beam_size, alpha, max_extra_length,
                             temperature, top_k, top_p)
            outputs.extend(" ".join(text.splitlines()) for text in tokenizer.decode_batch(np.asarray(ids)))
            indices.extend(batch["index"].tolist())
            progress.update(int((batch["index"] >= 0).sum()))
    ordered = restore_order(outputs, indices, len(encoded))
    # A source that is only EOS was an empty line: its translation is empty, keeping lines aligned.
    empty = encoded.source.lengths <= 1
    return ["" if is_empty else text for text, is_empty in zip(ordered, empty)]


def score_split(
    params: Any, config: TransformerConfig, split: EvalSet, tokenizer: Tokenizer,
    target_lang: str = "de", limit: int = 0, **options: Any,
) -> tuple[dict[str, Any], list[str]]:
    """Translate `split` (its first `limit` pairs when limit > 0) and score it against its references."""
    encoded = split.encoded if not limit else split.encoded.select(np.arange(min(limit, len(split.pairs))))
    references = [target for _, target in split.pairs[: len(encoded)]]
    hypotheses = translate_encoded(params, config, encoded, tokenizer, **options)
    return translation_scores(hypotheses, references, target_lang), hypotheses
