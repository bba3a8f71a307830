"""BLEU and chrF: the primary SacreBLEU figure and the labelled paper-style tokenized BLEU."""

import sacrebleu

from transformer_jax.evaluation.scores import (
    sacrebleu_scores,
    split_compounds,
    tokenized_compound_split_bleu,
    translation_scores,
)

HYPOTHESES = ["Die Katze sitzt auf der Matte.", "Das ist ein Staats-Oberhaupt-Treffen."]
REFERENCES = ["Die Katze saß auf der Matte.", "Das ist ein Staats-Oberhaupt-Gipfel."]


def test_sacrebleu_is_cased_detokenized_13a_with_signature():
    scores = sacrebleu_scores(HYPOTHESES, REFERENCES)
    assert abs(scores["bleu"] - sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score) < 1e-9
    assert "case:mixed" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    lowered = sacrebleu_scores([h.lower() for h in HYPOTHESES], REFERENCES)
    assert lowered["bleu"] < scores["bleu"]  # case matters
    assert 0 < scores["chrf"] < 100 and "nc:6|nw:0" in scores["chrf_signature"]  # chrF, character 6-grams


def test_compound_splitting_follows_the_tensor2tensor_script():
    assert split_compounds("Staats-Oberhaupt-Treffen") == "Staats ##AT##-##AT## Oberhaupt ##AT##-##AT## Treffen"
    assert split_compounds("a - b") == "a - b"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # one pass, as tensor2tensor's script


def test_tokenized_compound_split_bleu_rewards_compound_parts():
    # Splitting compounds gives partial credit for matching parts, so it scores above SacreBLEU here.
    paper_style = tokenized_compound_split_bleu(HYPOTHESES, REFERENCES)
    assert paper_style > sacrebleu_scores(HYPOTHESES, REFERENCES)["bleu"]
    assert abs(tokenized_compound_split_bleu(REFERENCES, REFERENCES) - 100.0) < 1e-9
    assert set(translation_scores(HYPOTHESES, REFERENCES)) >= {"bleu", "chrf", "tokenized_compound_split_bleu"}


def test_mismatched_line_counts_are_refused():
    try:
        sacrebleu_scores(HYPOTHESES, REFERENCES[:1])
    except ValueError as error:
        assert "2 hypotheses for 1 references" in str(error)
    else:
        raise AssertionError("expected a ValueError")
