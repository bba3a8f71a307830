"""Figures of a saved run: attention maps of a sentence pair and the positional-encoding matrix."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

import jax
import numpy as np

from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.config.schema import decoding_dtype
from transformer_jax.decoding.translate import decoding_precision, translate_batch
from transformer_jax.errors import ConfigError
from transformer_jax.checkpoints.saved_run import Run, open_run
from transformer_jax.checkpoints.selection import checkpoint_params, select_steps
from transformer_jax.evaluation.introspection import (
    ATTENTION_KINDS,
    attention_maps,
    positional_encoding_matrix,
)
from transformer_jax.evaluation.plots import (
    add_to_tensorboard,
    attention_figure,
    attention_title,
    plot_learning_curves,
    positional_encoding_figure,
    save_png,
)
from transformer_jax.evaluation.split_evaluation import checkpoint_tag
from transformer_jax.evaluation.text_translation import fit_to_model
from transformer_jax.base import workdir as layout


def decode_one(run: Run, params: Any, source_ids: np.ndarray, options: DecodeOptions, dtype: str = "") -> np.ndarray:
    """The output ids for one source [S] by `options` (beam, greedy or sample) in `dtype`, before EOS."""
    params, config = decoding_precision(params, run.model_config, dtype, jax.default_backend())
    output_ids = np.asarray(translate_batch(params, config, source_ids[None], options))[0]
    # The output ends at EOS, or at the length limit followed by padding.
    ends = np.flatnonzero((output_ids == EOS_ID) | (output_ids == PAD_ID))
    return output_ids[: ends[0]] if len(ends) else output_ids


def attention_pair(run: Run, params: Any, source: str, target: str | None,
                   options: DecodeOptions, dtype: str = "") -> tuple[np.ndarray, np.ndarray, str]:
    """Source ids [S] (with EOS), decoder input ids [T] (BOS + target) and where the target came from.

    Without a given `target`, the model translates `source` with the decoding `options`.
    """
    max_len = run.model_config.max_len
    source_ids = fit_to_model(np.array([run.tokenizer.encode(source) + [EOS_ID]], np.int32), max_len)[0]
    if target is None:
        target_ids = decode_one(run, params, source_ids, options, dtype)
        origin = f"the model's translation by {options.describe()}"
    else:
        target_ids = np.array(run.tokenizer.encode(target), np.int32)
        origin = "given by --attention_target"
    decoder_input_ids = np.concatenate([[BOS_ID], target_ids]).astype(np.int32)[:max_len]
    return source_ids, decoder_input_ids, origin


def plot_slug(text: str, words: int = 6) -> str:
    """A file-name-safe short name for a sentence: its first words, lower-cased, joined by '_', and a short hash of
    the whole sentence, so sentences that begin alike (or have no word characters) get files of their own."""
    kept = re.findall(r"\w+", text.lower())[:words]
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{'_'.join(kept)[:60] or 'sentence'}.{digest}"


def plot_attention(run: Run, params: Any, steps: list[int], source: str, target: str | None,
                   options: DecodeOptions, dtype: str = "") -> list[str]:
    """Write one PNG per attention kind (layers x heads panels) for a sentence pair; returns their paths.

    `params` are those of the checkpoint `steps` (several when averaged). Files:
    `<workdir>/plots/attention.<sentence>.<checkpoint tag>.<kind>.png`; the same images go to
    TensorBoard as `attention/<kind>` at the last of `steps`.
    """
    source_ids, decoder_input_ids, origin = attention_pair(run, params, source, target, options, dtype)
    maps = attention_maps(run.model_config, params, source_ids, decoder_input_ids)
    source_pieces = [run.tokenizer.piece(int(i)) for i in source_ids]
    target_pieces = [run.tokenizer.piece(int(i)) for i in decoder_input_ids]
    target_text = run.tokenizer.decode(decoder_input_ids)
    axes = {"encoder_self_attention": (source_pieces, source_pieces),
            "decoder_self_attention": (target_pieces, target_pieces),
            "encoder_decoder_attention": (target_pieces, source_pieces)}
    figures, paths, tag = {}, [], checkpoint_tag(steps)
    for kind in ATTENTION_KINDS:
        detail = (f"checkpoint {tag.replace('_', ' ')}; rows attend to columns\nsource: {source!r}\n"
                  f"target: {target_text!r} ({origin})")
        figure = attention_figure(maps[kind], *axes[kind], attention_title(kind, detail))
        figures[f"attention/{kind}"] = figure
        name = f"attention.{plot_slug(source)}.{tag}.{kind}.png"
        paths.append(save_png(figure, layout.run_path(run.workdir, layout.PLOTS, name)))
    add_to_tensorboard(run.workdir, figures, steps[-1])
    return paths


def plot_positional_encoding(run: Run, params: Any, step: int) -> str:
    """Write the positional-encoding matrix to `<workdir>/plots/positional_encoding.png` (and TensorBoard)."""
    matrix = positional_encoding_matrix(run.model_config, params)
    figure = positional_encoding_figure(matrix, run.model_config.positional_encoding)
    path = save_png(figure, layout.run_path(run.workdir, layout.PLOTS, layout.POSITIONAL_ENCODING_PLOT))
    add_to_tensorboard(run.workdir, {"positional_encoding": figure}, step)
    return path


def write_figures(workdir: str, spec: str, options_for: Callable[[Any], DecodeOptions], *,
                  attention: str | None = None, attention_target: str | None = None,
                  positional_encoding: bool = False, curves: bool = False, dtype: str | None = None) -> list[str]:
    """Write the figures asked for under `<workdir>/plots/` and return their paths.

    `attention` is a source sentence (its target: `attention_target`, or the model's translation by
    `options_for(run_config)`); `spec` names the checkpoint (see `select_steps`).
    """
    if attention_target is not None and attention is None:
        raise ConfigError("--attention_target needs --attention=SOURCE_SENTENCE")
    layout.check_layout(workdir, [layout.PLOTS])  # before any work
    if attention is not None or positional_encoding:
        layout.check_layout(workdir, [layout.TENSORBOARD])
    paths = [plot_learning_curves(workdir)] if curves else []
    if attention is None and not positional_encoding:
        return paths
    run = open_run(workdir)
    try:
        steps = select_steps(run.checkpointer, spec, run.config.eval.average_last)
        params = checkpoint_params(run, steps)
        if attention is not None:
            paths += plot_attention(run, params, steps, attention, attention_target, options_for(run.config),
                                    decoding_dtype(run.config) if dtype is None else dtype)
        if positional_encoding:
            paths.append(plot_positional_encoding(run, params, steps[-1]))
    finally:
        run.checkpointer.close()
    return paths
