"""Evaluation: scores the field reports, translating whole splits, choosing and averaging checkpoints, plots.

`scores` (SacreBLEU, chrF, the paper's tokenized BLEU) and `perplexity` (loss over a split) ->
`checkpoint_selection` (reopening a run, latest/best/average checkpoints) -> `translate_split`
(translate and score a split: the one function train.py and eval.py share) -> `introspection`
(attention weights, positional encodings), `plots` and `attention_plots` (figures).
"""

from transformer_jax.evaluation.checkpoint_selection import (
    Run,
    checkpoint_params,
    open_run,
    select_steps,
)
from transformer_jax.evaluation.perplexity import evaluate_loss
from transformer_jax.evaluation.scores import (
    sacrebleu_scores,
    tokenized_compound_split_bleu,
    translation_scores,
)
from transformer_jax.evaluation.translate_split import (
    translate_encoded,
    translate_lines,
)

__all__ = [
    "Run", "checkpoint_params", "evaluate_loss", "open_run", "sacrebleu_scores",
    "select_steps", "tokenized_compound_split_bleu", "translate_encoded", "translate_lines", "translation_scores",
]
