"""What eval.py does: score a checkpoint of a run on a split, or translate arbitrary text with it."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Iterator

import jax

from transformer_jax.atomic import write_atomically
from transformer_jax.evaluation import evaluate_loss
from transformer_jax.input_pipeline import eval_set, load_run_splits
from transformer_jax.model import Transformer
from transformer_jax.restore import Run, checkpoint_params, select_steps
from transformer_jax.tokenized import encode_pairs
from transformer_jax.training import eval_step
from transformer_jax.translation import score_split, translate_encoded


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


