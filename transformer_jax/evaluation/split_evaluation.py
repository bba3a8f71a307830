"""Translating and scoring whole splits (the one path the train and score commands share).

`evaluate_split` translates every sentence of a dev/test split with a `DecodeOptions` (text_translation.py's
`translate_encoded`), puts the outputs back in corpus order and scores them (SacreBLEU, chrF, the paper-style
BLEU, and optionally the loss); `evaluate_checkpoint` does the same for a saved run's checkpoint, and
`write_evaluation` writes them next to the run (after the command has printed the scores: a full disk loses
no score). With a mesh, translating and the loss are split over its devices; in a multi-process run every
process reads the whole split and gets the same translations and scores, and process 0 alone writes them.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import is_dir
from transformer_jax.base.sharding import mesh_platform
from transformer_jax.checkpoints.saved_run import Run
from transformer_jax.checkpoints.selection import checkpoint_params, select_steps
from transformer_jax.data.pipeline import EvalSet, eval_set, run_split
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import CheckpointError
from transformer_jax.evaluation.outputs import write_together
from transformer_jax.evaluation.scores import translation_scores
from transformer_jax.evaluation.text_translation import replicate, translate_encoded
from transformer_jax.model.config import TransformerConfig


def evaluate_split(
    params: Any, config: TransformerConfig, split: EvalSet, tokenizer: Tokenizer, options: DecodeOptions, *,
    batching: TranslationBatching = TranslationBatching(), dtype: str = "", target_lang: str = "de",
    loss_step: Callable | None = None, limit: int = 0, show_progress: bool = False, mesh: Mesh | None = None,
    interrupt: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Translate `split` (its first `limit` pairs when limit > 0) and score it against its references.

    Returns the scores (SacreBLEU and chrF with signatures, the paper-style BLEU; with `loss_step`
    (the run builder's dev-loss step), also loss, NLL, perplexity and accuracy over the same pairs) and
    the hypotheses.
    With `mesh`, translating and the loss are split over its devices (see `translate_encoded`). `interrupt`,
    called before each batch, abandons the evaluation by raising (a training run's stop).
    """
    encoded = split.encoded if not limit else split.encoded.select(np.arange(min(limit, len(split.pairs))))
    references = [target for _, target in split.pairs[: len(encoded)]]
    if mesh is not None:
        params = replicate(nn.meta.unbox(params), mesh)  # once, for decoding and the loss
    hypotheses = translate_encoded(params, config, encoded, tokenizer, options, batching=batching, dtype=dtype,
                                   show_progress=show_progress, mesh=mesh, interrupt=interrupt)
    results: dict[str, Any] = {"sentences": len(encoded),
                               **translation_scores(hypotheses, references, target_lang)}
    if loss_step is not None:
        # Here, not at the top: translating (a Translator, the train command's BLEU) loads no train step nor optax.
        from transformer_jax.training.dev_loss import evaluate_loss

        rows = min(batching.batch_size, len(encoded))  # more would be all padding (--batch_size=2**30: memory)
        results.update(evaluate_loss(loss_step, params, encoded, rows, mesh, interrupt=interrupt))
    return results, hypotheses


def write_results(path_base: str, results: dict[str, Any], hypotheses: list[str]) -> str:
    """Write `<path_base>.hyp` (one translation per line) and `<path_base>.json`, both or neither; returns the
    .hyp path. A failure (a full disk) is the OSError naming the file it failed on; no temporary is left."""
    write_together({path_base + ".hyp": "".join(line + "\n" for line in hypotheses),
                    path_base + ".json": json.dumps(results, indent=2) + "\n"})
    return path_base + ".hyp"


def checkpoint_tag(steps: list[int]) -> str:
    """A file-name-safe name for the evaluated parameters, e.g. 'step_1500' or 'average_3_to_1500'."""
    if len(steps) == 1:
        return f"step_{steps[0]}"
    return f"average_{len(steps)}_to_{steps[-1]}"


def evaluate_checkpoint(run: Run, spec: str, split: str, options: DecodeOptions, *,
                        batching: TranslationBatching = TranslationBatching(), dtype: str = "",
                        mesh: Mesh | None = None) -> tuple[dict[str, Any], list[str]]:
    """Translate every sentence of `split` with the checkpoint(s) `spec` names; return the scores and translations.

    "average" averages the run's `eval.average_last` checkpoints; `write_evaluation` writes the results
    (a file standing where their folder goes, or a directory where one of them goes, fails here, before any
    work). With `mesh`, the work is split over its devices; the loss is the run builder's dev-loss step, as in
    training. In a multi-process run every process calls this alike (restoring and translating are collective)
    and gets the same results.
    """
    layout.check_layout(run.workdir, [layout.EVAL])
    steps = select_steps(run.checkpointer, spec, run.config.eval.average_last)
    for path in _result_paths(run, split, steps):
        if is_dir(path):
            raise CheckpointError(f"{path} is a directory, where the translations and scores are written; move it "
                                  "away and run the same command again")
    from transformer_jax.training.dev_loss import dev_loss_step  # the trainer's, loaded only by the score command

    platform = mesh_platform(mesh) if mesh is not None else jax.default_backend()
    loss_step = dev_loss_step(run.model_config.runnable_on(platform), run.config.training.label_smoothing, mesh)
    params = checkpoint_params(run, steps)
    pairs = run_split(run.config, run.workdir, split)
    scores, hypotheses = evaluate_split(
        params, run.model_config, eval_set(pairs, run.tokenizer), run.tokenizer, options, batching=batching,
        dtype=dtype, target_lang=run.config.data.target_lang, loss_step=loss_step, show_progress=True, mesh=mesh)
    return {"split": split, "checkpoint": spec, "steps": steps, **scores}, hypotheses


def _result_base(run: Run, split: str, steps: list[int]) -> str:
    """Where `write_evaluation` writes the results of `steps` on `split`: this, with .hyp and .json added."""
    return layout.run_path(run.workdir, layout.EVAL, f"{split}.{checkpoint_tag(steps)}")


def _result_paths(run: Run, split: str, steps: list[int]) -> list[str]:
    return [_result_base(run, split, steps) + suffix for suffix in (".hyp", ".json")]


def write_evaluation(run: Run, results: dict[str, Any], hypotheses: list[str]) -> str:
    """Write `evaluate_checkpoint`'s results to `<workdir>/eval/<split>.<tag>.hyp` and `.json` (see
    `write_results`); returns the .hyp path."""
    return write_results(_result_base(run, results["split"], results["steps"]), results, hypotheses)


def format_results(results: dict[str, Any]) -> str:
    """The scores eval.py prints: primary SacreBLEU first, the paper-style figure labelled."""
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
    return "\n".join(lines)
