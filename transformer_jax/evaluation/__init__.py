"""Evaluation: scores the field reports, translating whole splits, figures.

`outputs` (output folders checked before any work, files written whole) and `scores` (SacreBLEU, chrF,
the paper's tokenized BLEU) -> `text_translation` (encoded sentences, lines, files and standard input
translated) -> `split_evaluation` (translate and score a split: the one path the train and score commands share)
-> `device_batches` (translation batches sized for the devices when none is given) -> `translator` (`Translator`:
a run loaded once, from Python) -> `corpus_shards` (a corpus's shards kept whole with their records) ->
`corpus_translation` (whole corpora, resumably) -> `introspection` (attention weights, positional encodings), `plots`
and `attention_plots` (figures).

Importing it loads no trainer (no optax, no train step, nothing of `run/`): the dev loss that `evaluate_checkpoint`
and `evaluate_split` compute on request is imported from `training/dev_loss.py` where they compute it.
"""

from transformer_jax.evaluation import corpus_translation
from transformer_jax.evaluation.attention_plots import write_figures
from transformer_jax.evaluation.device_batches import device_memory_bytes, sized_batching
from transformer_jax.evaluation.outputs import check_new_output, check_outside_checkpoints
from transformer_jax.evaluation.plots import plot_learning_curves
from transformer_jax.evaluation.scores import sacrebleu_scores, tokenized_compound_split_bleu, translation_scores
from transformer_jax.evaluation.split_evaluation import (
    evaluate_checkpoint,
    evaluate_split,
    format_results,
    write_evaluation,
    write_results,
)
from transformer_jax.evaluation.text_translation import (check_input, check_texts, translate_encoded, translate_file,
                                                        translate_lines)
from transformer_jax.evaluation.translator import Translator

__all__ = [
    "Translator",
    "check_input",
    "check_texts",
    "check_new_output",
    "check_outside_checkpoints",
    "corpus_translation",
    "device_memory_bytes",
    "evaluate_checkpoint",
    "evaluate_split",
    "format_results",
    "plot_learning_curves",
    "sacrebleu_scores",
    "sized_batching",
    "tokenized_compound_split_bleu",
    "translate_encoded",
    "translate_file",
    "translate_lines",
    "translation_scores",
    "write_evaluation",
    "write_figures",
    "write_results",
]
