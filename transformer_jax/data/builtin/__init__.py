"""The built-in synthetic EN->DE corpus: a made-up lexicon (`lexicon`) and a small grammar (`corpus`).

It lets the whole pipeline run offline in minutes; its BLEU shows the pipeline learns to translate,
not how the model does on real language.
"""

from transformer_jax.data.builtin.corpus import builtin_corpus, generate_pairs

__all__ = ["builtin_corpus", "generate_pairs"]
