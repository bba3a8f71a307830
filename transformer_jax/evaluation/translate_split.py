"""Translating and scoring whole splits (the one path train.py and eval.py share), and translating text.

`evaluate_split` translates every sentence of a dev/test split with a `DecodeOptions`, detokenizes,
puts the outputs back in corpus order and scores them (SacreBLEU, chrF, the paper-style BLEU, and
optionally the loss); `evaluate_checkpoint` does the same for a saved run's checkpoint and writes
the results next to the run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from typing import Any, Iterable, Iterator

import jax
import numpy as np
from tqdm import tqdm

from transformer_jax.data.batching import eval_batches, restore_order
from transformer_jax.data.encoded import EncodedPairs, encode_pairs
from transformer_jax.data.pipeline import EvalSet, eval_set, load_run_splits
from transformer_jax.data.sources import read_lines
from transformer_jax.data.tokenizer import EOS_ID, Tokenizer
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.translate import translate_batch
from transformer_jax.errors import DataError
from transformer_jax.evaluation.checkpoint_selection import (
    Run,
    checkpoint_params,
    select_steps,
)
from transformer_jax.evaluation.perplexity import evaluate_loss
from transformer_jax.evaluation.scores import translation_scores
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.run.files import write_atomically
from transformer_jax.training.step import eval_step


@functools.partial(jax.jit, static_argnames=("config", "options"))
def _translate(params: Any, src_tokens: jax.Array, rng: jax.Array, config: TransformerConfig,
               options: DecodeOptions) -> jax.Array:
    return translate_batch(params, config, src_tokens, options, rng)


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
    params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
    options: DecodeOptions = DecodeOptions(), *, show_progress: bool = True,
) -> list[str]:
    """Detokenized translations of every source sentence, in corpus order; empty sources give ''.

    Each translation is one line: a newline the tokenizer's byte pieces produce becomes a space.
    """
    rng = jax.random.key(options.seed)
    outputs: list[str] = []
    indices: list[int] = []
    with tqdm(total=len(encoded), unit="sent", desc="translate", disable=not show_progress) as progress:
        for batch in eval_batches(encoded, options.batch_size):
            src = fit_to_model(batch["inputs"], config.max_len)
            rng, key = jax.random.split(rng)
            ids = _translate(params, src, key, config, options)
            outputs.extend(" ".join(text.splitlines()) for text in tokenizer.decode_batch(np.asarray(ids)))
            indices.extend(batch["index"].tolist())
            progress.update(int((batch["index"] >= 0).sum()))
    ordered = restore_order(outputs, indices, len(encoded))
    # A source that is only EOS was an empty line: its translation is empty, keeping lines aligned.
    empty = encoded.source.lengths <= 1
    return ["" if is_empty else text for text, is_empty in zip(ordered, empty)]


def evaluate_split(
    params: Any, config: TransformerConfig, split: EvalSet, tokenizer: Tokenizer, options: DecodeOptions, *,
    target_lang: str = "de", label_smoothing: float | None = None, limit: int = 0,
    show_progress: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Translate `split` (its first `limit` pairs when limit > 0) and score it against its references.

    Returns the scores (SacreBLEU and chrF with signatures, the paper-style BLEU; with
    `label_smoothing`, also loss, NLL, perplexity and accuracy over the same pairs) and the hypotheses.
    """
    encoded = split.encoded if not limit else split.encoded.select(np.arange(min(limit, len(split.pairs))))
    references = [target for _, target in split.pairs[: len(encoded)]]
    hypotheses = translate_encoded(params, config, encoded, tokenizer, options, show_progress=show_progress)
    results: dict[str, Any] = {"sentences": len(encoded),
                               **translation_scores(hypotheses, references, target_lang)}
    if label_smoothing is not None:
        apply_fn = Transformer(config).apply
        loss_step = jax.jit(lambda p, b: eval_step(p, apply_fn, b, label_smoothing))
        results.update(evaluate_loss(loss_step, params, encoded, options.batch_size))
    return results, hypotheses


def write_results(path_base: str, results: dict[str, Any], hypotheses: list[str]) -> str:
    """Write `<path_base>.hyp` (one translation per line) and `<path_base>.json`; returns the .hyp path."""
    write_atomically(path_base + ".hyp", "".join(line + "\n" for line in hypotheses))
    write_atomically(path_base + ".json", json.dumps(results, indent=2) + "\n")
    return path_base + ".hyp"


def checkpoint_tag(steps: list[int]) -> str:
    """A file-name-safe name for the evaluated parameters, e.g. 'step_1500' or 'average_3_to_1500'."""
    if len(steps) == 1:
        return f"step_{steps[0]}"
    return f"average_{len(steps)}_to_{steps[-1]}"


def evaluate_checkpoint(run: Run, spec: str, split: str, options: DecodeOptions) -> dict[str, Any]:
    """Translate every sentence of `split` with the checkpoint(s) `spec` names; write and return the scores.

    "average" averages the run's `eval.average_last` checkpoints. Hypotheses go to
    `<workdir>/eval/<split>.<tag>.hyp`, scores to the matching `.json`.
    """
    steps = select_steps(run.checkpointer, spec, run.config.eval.average_last)
    params = checkpoint_params(run, steps)
    pairs = load_run_splits(run.config.data, run.config.training.seed, (split,))[split]
    scores, hypotheses = evaluate_split(
        params, run.model_config, eval_set(pairs, run.tokenizer), run.tokenizer, options,
        target_lang=run.config.data.target_lang, label_smoothing=run.config.training.label_smoothing,
        show_progress=True)
    results = {"split": split, "checkpoint": spec, "steps": steps, **scores}
    base = os.path.join(run.workdir, "eval", f"{split}.{checkpoint_tag(steps)}")
    results["hypotheses_path"] = write_results(base, results, hypotheses)
    return results


def translate_lines(run: Run, params: Any, lines: Iterable[str], options: DecodeOptions) -> Iterator[str]:
    """Translations of `lines`, yielded in order; `options.batch_size` lines are decoded together."""
    buffer: list[str] = []
    for line in lines:
        buffer.append(line.rstrip("\n"))
        if len(buffer) == options.batch_size:
            yield from _translate_chunk(run, params, buffer, options)
            buffer = []
    if buffer:
        yield from _translate_chunk(run, params, buffer, options)


def translate_file(run: Run, params: Any, path: str, options: DecodeOptions) -> Iterator[str]:
    """Translations of each line of the UTF-8 text file `path` ("-": standard input, a line at a time)."""
    if path == "-":
        yield from translate_lines(run, params, sys.stdin, options.replace(batch_size=1))
        return
    if not os.path.isfile(path):
        raise DataError(f"--translate file {path} does not exist; pass a text file or -")
    yield from translate_lines(run, params, read_lines(path), options)


def _translate_chunk(run: Run, params: Any, texts: list[str], options: DecodeOptions) -> list[str]:
    encoded = encode_pairs([(text, "") for text in texts], run.tokenizer)
    # Decode as many rows as there are lines (one for interactive use), not a full eval batch.
    options = options.replace(batch_size=min(options.batch_size, len(texts)))
    return translate_encoded(params, run.model_config, encoded, run.tokenizer, options, show_progress=False)


def format_results(results: dict[str, Any]) -> str:
    """The lines eval.py prints: primary SacreBLEU first, the paper-style figure labelled."""
    lines = [
        f"{results['split']} ({results['sentences']} sentences, checkpoint {results['checkpoint']} "
        f"= steps {results['steps']})",
        f"  SacreBLEU {results['bleu']:.2f}  {results['bleu_signature']}",
        f"  chrF {results['chrf']:.2f}  {results['chrf_signature']}",
        f"  tokenized compound-split BLEU {results['tokenized_compound_split_bleu']:.2f} "
        "(paper-style; not comparable with SacreBLEU)",
    ]
    if "loss" in results:
        lines.append(f"  loss {results['loss']:.4f}  perplexity {results['perplexity']:.2f}")
    lines.append(f"  hypotheses: {results['hypotheses_path']}")
    return "\n".join(lines)
