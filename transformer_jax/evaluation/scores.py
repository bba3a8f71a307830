"""BLEU and chrF the way the field reports them.

Primary: SacreBLEU on detokenized, cased output with its signature (tokenizer 13a). Secondary and
labelled as such: the paper's tokenized BLEU, computed on Moses-tokenized text with hyphenated
compounds split ("a-b" -> "a ##AT##-##AT## b"), which is what tensor2tensor's `get_ende_bleu.sh`
reports and is not comparable with SacreBLEU figures.
"""

from __future__ import annotations

import re
from typing import Sequence

import sacrebleu

_COMPOUND = re.compile(r"(\S)-(\S)")


def sacrebleu_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | str]:
    """SacreBLEU (cased, detokenized, 13a) and chrF, with their signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu = sacrebleu.metrics.BLEU(tokenize="13a")
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
    }


def split_compounds(text: str) -> str:
    """`perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'` of tensor2tensor's get_ende_bleu.sh: one
    non-overlapping pass, so "a-b-c" keeps its second hyphen, as that script does."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def tokenized_compound_split_bleu(
    hypotheses: Sequence[str], references: Sequence[str], language: str = "de"
) -> float:
    """The paper's tokenized BLEU (Moses tokenizer, compound splitting); for comparison with the paper only."""
    # Imported here: sacremoses compiles its patterns on import (0.6 s), which a command that only translates,
    # or stops before scoring, need not pay.
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=language)

    def prepare(text: str) -> str:
        return split_compounds(tokenizer.tokenize(text, return_str=True, escape=False))

    bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    return bleu.corpus_score(
        [prepare(h) for h in hypotheses], [[prepare(r) for r in references]]
    ).score


def translation_scores(
    hypotheses: Sequence[str], references: Sequence[str], target_lang: str = "de"
) -> dict[str, float | str]:
    """SacreBLEU + chrF (primary) and the paper-style tokenized compound-split BLEU (secondary)."""
    scores = sacrebleu_scores(hypotheses, references)
    scores["tokenized_compound_split_bleu"] = tokenized_compound_split_bleu(
        hypotheses, references, target_lang
    )
    return scores
