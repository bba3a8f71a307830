"""Evaluation: scores the field reports, translating whole splits, figures.

`outputs` (output folders checked before any work, files written whole) and `scores` (SacreBLEU, chrF,
the paper's tokenized BLEU) -> `translate_split` (translate and score a split: the one function
train.py and eval.py share; translating text) -> `introspection` (attention weights, positional
encodings), `plots` and `attention_plots` (figures).
"""

from transformer_jax.evaluation import corpus_translation
from transformer_jax.evaluation.attention_plots import write_figures
from transformer_jax.evaluation.outputs import check_new_output, check_outside_checkpoints
from transformer_jax.evaluation.plots import plot_learning_curves
from transformer_jax.evaluation.scores import sacrebleu_scores, tokenized_compound_split_bleu, translation_scores
from transformer_jax.evaluation.translate_split import (
    check_input,
    evaluate_checkpoint,
    evaluate_split,
    format_results,
    translate_encoded,
    translate_file,
    translate_lines,
    write_evaluation,
    write_results,
)
from transformer_jax.evaluation.translator import Translator

__all__ = [
    "Translator",
    "check_input",
    "check_new_output",
    "check_outside_checkpoints",
    "corpus_translation",
    "evaluate_checkpoint",
    "evaluate_split",
    "format_results",
    "plot_learning_curves",
    "sacrebleu_scores",
    "tokenized_compound_split_bleu",
    "translate_encoded",
    "translate_file",
    "translate_lines",
    "translation_scores",
    "write_evaluation",
    "write_figures",
    "write_results",
]
