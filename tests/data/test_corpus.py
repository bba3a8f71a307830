"""The built-in corpus: deterministic, large enough, needs real translation (not copying)."""

import collections
import re

import numpy as np
import pytest
import sacrebleu

from transformer_jax.data.builtin import corpus, lexicon

NUM_TRAIN = 6_000


@pytest.fixture(scope="module")
def splits():
    return corpus.builtin_corpus(num_train=NUM_TRAIN, num_dev=300, num_test=500)


def _types(sentences, side):
    return {re.sub(r"[.,?]", "", w) for s in sentences for w in s[side].split()}


def test_sizes_and_disjoint_splits(splits):
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [NUM_TRAIN, 300, 500]
    sources = [{e for e, _ in splits[s]} for s in ("train", "dev", "test")]
    assert sum(map(len, sources)) == len(set.union(*sources))  # no sentence is in two splits


def test_deterministic_and_test_set_independent_of_train_size(splits):
    again = corpus.builtin_corpus(num_train=100, num_dev=300, num_test=500)
    assert again["test"] == splits["test"] and again["dev"] == splits["dev"]
    assert again["train"] == splits["train"][:100]
    assert corpus.builtin_corpus(num_train=50, num_dev=5, num_test=5, seed=1)["test"] != splits["test"][:5]


def test_asking_for_some_splits_gives_the_same_sentences(splits):
    # eval.py loads only the split it scores: it must be the very split training held out.
    test_only = corpus.builtin_corpus(num_train=NUM_TRAIN, num_dev=300, num_test=500, splits=("test",))
    assert list(test_only) == ["test"] and test_only["test"] == splits["test"]
    dev_only = corpus.builtin_corpus(num_train=NUM_TRAIN, num_dev=300, num_test=500, splits=("dev",))
    assert list(dev_only) == ["dev"] and dev_only["dev"] == splits["dev"]


def test_default_size_has_at_least_1000_word_types_per_side(splits):
    assert len(_types(splits["train"], 0)) >= 1000
    assert len(_types(splits["train"], 1)) >= 1000


def test_sentence_lengths_span_3_to_30_words(splits):
    for side in (0, 1):
        lengths = np.array([len(pair[side].split()) for pair in splits["train"]])
        assert lengths.min() >= corpus.MIN_WORDS and lengths.max() <= corpus.MAX_WORDS
        assert lengths.min() <= 4 and lengths.max() >= 27
    english, german = (np.array([len(p[side].split()) for p in splits["train"]]) for side in (0, 1))
    assert np.mean(english != german) > 0.3  # do-support, compounds, contractions change lengths


def test_copying_the_source_scores_near_zero_bleu(splits):
    sources = [e for e, _ in splits["test"]]
    references = [g for _, g in splits["test"]]
    assert sacrebleu.corpus_bleu(sources, [references]).score < 5
    assert sacrebleu.corpus_bleu(references, [references]).score == pytest.approx(100)


def test_each_source_sentence_has_exactly_one_translation():
    # A five-noun lexicon makes the same English sentence come up again and again.
    tiny = lexicon.build_lexicon(0, num_nouns=5, num_verbs=(2, 2, 1), num_adjectives=2, num_names=2)
    german_of = collections.defaultdict(set)
    drawn = collections.Counter()
    for english, german in corpus.generate_pairs(20_000, seed=0, lexicon=tiny, unique=False):
        german_of[english].add(german)
        drawn[english] += 1
    assert sum(count - 1 for count in drawn.values()) > 100  # many sentences were drawn repeatedly...
    assert all(len(translations) == 1 for translations in german_of.values())  # ...always translated alike


def _finite_forms():
    lex = lexicon.build_lexicon(0)
    verbs = [v for kind in lex.verbs.values() for v in kind]
    finite = {v.german_present(a) for v in verbs for a in lexicon.AGREEMENTS}
    finite |= {v.german_past(a) for v in verbs for a in lexicon.AGREEMENTS}
    return finite | {w for table in lexicon.DE_AUXILIARIES.values() for w in table.values()}


@pytest.fixture(scope="module")
def pairs():
    return corpus.generate_pairs(4_000, seed=0)


def test_subordinate_clauses_are_verb_final(pairs):
    finite = _finite_forms()
    clauses = [m.group(1).split() for _, g in pairs for m in re.finditer(r"\b(?:weil|obwohl|bevor) ([^,.?]*)", g, re.I)]
    assert len(clauses) > 100
    assert all(words[-1] in finite for words in clauses)
    assert sum(words[1] in finite for words in clauses) < len(clauses) / 10  # not verb-second


def test_main_clause_inverts_after_time_adverb_and_puts_participle_last(pairs):
    finite = _finite_forms()
    fronted = [g.split() for e, g in pairs if e.startswith(("Yesterday ", "Today ", "Tomorrow "))]
    assert len(fronted) > 20 and all(words[1] in finite for words in fronted)
    perfect = [g.split() for e, g in pairs if re.fullmatch(r"(He|She) has [a-z]+ed [^,]*\.", e)
               and "," not in g and " und " not in g]
    assert perfect and all(w[1] == "hat" and w[-1].startswith("ge") for w in perfect)


def test_verbs_agree_with_pronoun_subjects(pairs):
    endings = {"Ich": ("e", "te", "werde", "habe", "kann", "muss"), "Du": ("st", "wirst", "hast", "kannst", "musst"),
               "Wir": ("en", "werden", "haben", "können", "müssen")}
    checked = collections.Counter()
    for _, german in pairs:
        words = german.replace(",", "").split()
        if words[0] in endings and words[1] != "nicht":
            assert words[1].endswith(endings[words[0]]), german
            checked[words[0]] += 1
    assert len(checked) == 3 and min(checked.values()) > 10


def test_articles_and_adjective_endings_agree_with_noun_gender(pairs):
    lex = lexicon.build_lexicon(0)
    gender_of = {n.german: n.gender for n in lex.nouns}
    ending_of = {a.german + e: e for a in lex.adjectives for e in ("e", "en", "er", "es")}
    # (article, adjective ending) pairs German allows in the singular, per gender, over all cases.
    allowed = {0: {("der", "e"), ("den", "en"), ("dem", "en"), ("ein", "er"), ("einen", "en"), ("einem", "en")},
               1: {("die", "e"), ("der", "en"), ("eine", "e"), ("einer", "en")},
               2: {("das", "e"), ("dem", "en"), ("ein", "es"), ("einem", "en")}}
    articles = {"der", "die", "das", "den", "dem", "ein", "eine", "einen", "einem", "einer"}
    seen = collections.Counter()
    for _, german in pairs:
        words = [w.strip(",.?") for w in german.split()]
        for article, adjective, noun in zip(words, words[1:], words[2:]):
            if article.lower() in articles and adjective in ending_of and noun in gender_of:
                assert (article.lower(), ending_of[adjective]) in allowed[gender_of[noun]], german
                seen[gender_of[noun]] += 1
    assert len(seen) == 3 and min(seen.values()) > 20
