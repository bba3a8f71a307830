"""What eval.py does: score a checkpoint of a run on a split, or translate arbitrary text with it."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Iterator

import jax
import numpy as np

from transformer_jax.atomic import write_atomically
from transformer_jax.decode import translate_batch
from transformer_jax.evaluation import evaluate_loss
from transformer_jax.input_pipeline import eval_set, load_run_splits
from transformer_jax.introspection import ATTENTION_KINDS, attention_maps, positional_encoding_matrix
from transformer_jax.model import Transformer
from transformer_jax.plots import (PLOTS_DIRNAME, add_to_tensorboard, attention_figure, attention_title,
                                   positional_encoding_figure, save_png)
from transformer_jax.restore import Run, checkpoint_params, select_steps
from transformer_jax.tokenized import encode_pairs
from transformer_jax.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.training import eval_step
from transformer_jax.translation import fit_to_model, score_split, translate_encoded


def checkpoint_tag(spec: str, steps: list[int]) -> str:
    """A file-name-safe name for the evaluated parameters, e.g. 'step_1500' or 'average_3_to_1500'."""
    if len(steps) == 1:
        return f"step_{steps[0]}"
    return f"average_{len(steps)}_to_{steps[-1]}"


def evaluate_checkpoint(run: Run, spec: str, split: str, options: dict[str, Any]) -> dict[str, Any]:
    """Translate every sentence of `split` with the checkpoint(s) `spec` names; write and return the scores.

    Hypotheses go to `<workdir>/eval/<split>.<tag>.hyp`, scores to the matching `.json`.
    """
    steps = select_steps(run.checkpointer, spec)
    params = checkpoint_params(run, steps)
    pairs = load_run_splits(run.config.data, run.config.training.seed, (split,))[split]
    data = eval_set(pairs, run.tokenizer)
    scores, hypotheses = score_split(params, run.model_config, data, run.tokenizer,
                                     run.config.data.target_lang, **options)
    apply_fn = Transformer(run.model_config).apply
    smoothing = run.config.training.label_smoothing
    loss_step = jax.jit(lambda p, b: eval_step(p, apply_fn, b, smoothing))
    losses = evaluate_loss(loss_step, params, data.encoded, options.get("batch_size", 64))
    tag = checkpoint_tag(spec, steps)
    results = {"split": split, "checkpoint": spec, "steps": steps, "sentences": len(pairs),
               **scores, **{f"{k}": v for k, v in losses.items()}}
    base = os.path.join(run.workdir, "eval", f"{split}.{tag}")
    write_atomically(base + ".hyp", "".join(line + "\n" for line in hypotheses))
    write_atomically(base + ".json", json.dumps(results, indent=2) + "\n")
    results["hypotheses_path"] = base + ".hyp"
    return results


def translate_lines(run: Run, params: Any, lines: Iterable[str], options: dict[str, Any],
                    chunk: int = 1) -> Iterator[str]:
    """Translations of `lines`, yielded in order; `chunk` lines are decoded together."""
    buffer: list[str] = []
    for line in lines:
        buffer.append(line.rstrip("\n"))
        if len(buffer) == chunk:
            yield from _translate_chunk(run, params, buffer, options)
            buffer = []
    if buffer:
        yield from _translate_chunk(run, params, buffer, options)


def _translate_chunk(run: Run, params: Any, texts: list[str], options: dict[str, Any]) -> list[str]:
    encoded = encode_pairs([(text, "") for text in texts], run.tokenizer)
    # Decode as many rows as there are lines (one for interactive use), not a full eval batch.
    batch_size = min(options.get("batch_size", 64), len(texts))
    return translate_encoded(params, run.model_config, encoded, run.tokenizer,
                             **{**options, "batch_size": batch_size, "show_progress": False})


def format_results(results: dict[str, Any]) -> str:
    """The lines eval.py prints: primary SacreBLEU first, the paper-style figure labelled."""
    return "\n".join([
        f"{results['split']} ({results['sentences']} sentences, checkpoint {results['checkpoint']} "
        f"= steps {results['steps']})",
        f"  SacreBLEU {results['bleu']:.2f}  {results['bleu_signature']}",
        f"  chrF {results['chrf']:.2f}  {results['chrf_signature']}",
        f"  tokenized compound-split BLEU {results['tokenized_compound_split_bleu']:.2f} "
        "(paper-style; not comparable with SacreBLEU)",
        f"  loss {results['loss']:.4f}  perplexity {results['perplexity']:.2f}",
        f"  hypotheses: {results['hypotheses_path']}",
    ])




def decode_one(run: Run, params: Any, source_ids: np.ndarray, options: dict[str, Any]) -> np.ndarray:
    """The output ids for one source [S] by the mode of `options` (beam, greedy or sample), before EOS."""
    mode = options.get("mode", "beam")
    settings: dict[str, Any] = {"max_extra_length": options.get("max_extra_length", 50)}
    if mode == "beam":
        settings.update(beam_size=options.get("beam_size", 4), alpha=options.get("alpha", 0.6))
    if mode == "sample":
        settings.update(rng=jax.random.key(options.get("seed", 0)), temperature=options.get("temperature", 1.0),
                        top_k=options.get("top_k", 0), top_p=options.get("top_p", 1.0))
    output_ids = np.asarray(translate_batch(params, run.model_config, source_ids[None], mode=mode, **settings))[0]
    # The output ends at EOS, or at the length limit followed by padding.
    ends = np.flatnonzero((output_ids == EOS_ID) | (output_ids == PAD_ID))
    return output_ids[: ends[0]] if len(ends) else output_ids


def decoding_description(options: dict[str, Any]) -> str:
    """How a translation was produced, in words, e.g. 'beam search (beam 4, alpha 0.6)'."""
    mode = options.get("mode", "beam")
    if mode == "beam":
        return f"beam search (beam {options.get('beam_size', 4)}, alpha {options.get('alpha', 0.6)})"
    return "greedy decoding" if mode == "greedy" else f"sampling (seed {options.get('seed', 0)})"


def attention_pair(run: Run, params: Any, source: str, target: str | None,
                   options: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, str]:
    """Source ids [S] (with EOS), decoder input ids [T] (BOS + target) and where the target came from.

    Without a given `target`, the model translates `source` with the decoding `options`.
    """
    max_len = run.model_config.max_len
    source_ids = fit_to_model(np.array([run.tokenizer.encode(source) + [EOS_ID]], np.int32), max_len)[0]
    if target is None:
        target_ids = decode_one(run, params, source_ids, options)
        origin = f"the model's translation by {decoding_description(options)}"
    else:
        target_ids = np.array(run.tokenizer.encode(target), np.int32)
        origin = "given by --plot_attention_target"
    decoder_input_ids = np.concatenate([[BOS_ID], target_ids]).astype(np.int32)[:max_len]
    return source_ids, decoder_input_ids, origin


def plot_slug(text: str, words: int = 6) -> str:
    """A file-name-safe short name for a sentence: its first words, lower-cased, joined by '_'."""
    kept = re.findall(r"\w+", text.lower())[:words]
    return "_".join(kept)[:60] or "empty"


def plot_attention(run: Run, params: Any, steps: list[int], source: str, target: str | None,
                   options: dict[str, Any]) -> list[str]:
    """Write one PNG per attention kind (layers x heads panels) for a sentence pair; returns their paths.

    `params` are those of the checkpoint `steps` (several when averaged). Files:
    `<workdir>/plots/attention.<sentence>.<checkpoint tag>.<kind>.png`; the same images go to
    TensorBoard as `attention/<kind>` at the last of `steps`.
    """
    source_ids, decoder_input_ids, origin = attention_pair(run, params, source, target, options)
    maps = attention_maps(run.model_config, params, source_ids, decoder_input_ids)
    source_pieces = [run.tokenizer.piece(int(i)) for i in source_ids]
    target_pieces = [run.tokenizer.piece(int(i)) for i in decoder_input_ids]
    target_text = run.tokenizer.decode(decoder_input_ids)
    axes = {"encoder_self_attention": (source_pieces, source_pieces),
            "decoder_self_attention": (target_pieces, target_pieces),
            "encoder_decoder_attention": (target_pieces, source_pieces)}
    figures, paths, tag = {}, [], checkpoint_tag("", steps)
    for kind in ATTENTION_KINDS:
        detail = (f"checkpoint {tag.replace('_', ' ')}; rows attend to columns\nsource: {source!r}\n"
                  f"target: {target_text!r} ({origin})")
        figure = attention_figure(maps[kind], *axes[kind], attention_title(kind, detail))
        figures[f"attention/{kind}"] = figure
        name = f"attention.{plot_slug(source)}.{tag}.{kind}.png"
        paths.append(save_png(figure, os.path.join(run.workdir, PLOTS_DIRNAME, name)))
    add_to_tensorboard(run.workdir, figures, steps[-1])
    return paths


def plot_positional_encoding(run: Run, params: Any, step: int) -> str:
    """Write the positional-encoding matrix to `<workdir>/plots/positional_encoding.png` (and TensorBoard)."""
    matrix = positional_encoding_matrix(run.model_config, params)
    figure = positional_encoding_figure(matrix, run.model_config.positional_encoding)
    path = save_png(figure, os.path.join(run.workdir, PLOTS_DIRNAME, "positional_encoding.png"))
    add_to_tensorboard(run.workdir, {"positional_encoding": figure}, step)
    return path
