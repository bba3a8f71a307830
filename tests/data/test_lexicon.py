"""Lexicon of the built-in corpus: distinct words per side, German inflection, determinism."""

from transformer_jax.data.builtin import lexicon


def _english_forms(lex):
    forms = {w for n in lex.nouns for w in (n.english, n.english_plural)}
    forms |= {w for kind in lex.verbs.values() for v in kind for w in (v.english, v.english_3sg, v.english_past)}
    return forms | {w for a in lex.adjectives for w in (a.english, a.english_adverb)}


def _german_forms(lex):
    forms = {w.lower() for n in lex.nouns for w in (n.german, n.german_plural, n.german_form(True, "dat"))}
    for verbs in lex.verbs.values():
        for verb in verbs:
            forms |= {verb.german_present(a) for a in lexicon.AGREEMENTS} | {verb.german_participle}
    return forms | {a.german + ending for a in lex.adjectives for ending in ("", "e", "en", "er", "es")}


def test_sizes_and_no_word_shared_between_the_sides():
    lex = lexicon.build_lexicon(0)
    assert len(lex.nouns) == 320 and len(lex.adjectives) == 140 and len(lex.names) == 40
    assert [len(lex.verbs[k]) for k in ("transitive", "intransitive", "clausal")] == [140, 40, 20]
    english, german = _english_forms(lex), _german_forms(lex)
    assert len(english) == 2 * 320 + 3 * 200 + 2 * 140  # every lemma's forms are distinct words
    assert not english & german
    assert not english & lexicon.FUNCTION_WORDS_DE and not german & lexicon.FUNCTION_WORDS_EN


def test_german_inflection_rules():
    verb = lexicon.Verb("blerk", "blerks", "blerked", "schlang", "transitive")
    assert [verb.german_present(a) for a in lexicon.AGREEMENTS] == \
        ["schlange", "schlangst", "schlangt", "schlangen", "schlangen"]
    assert verb.german_past("2sg") == "schlangtest" and verb.german_participle == "geschlangt"
    assert verb.german_infinitive == "schlangen"
    noun = lexicon.Noun("dog", "dogs", "Hund", "Hunde", 0)
    assert noun.german_form(True, "dat") == "Hunden" and noun.german_form(True, "acc") == "Hunde"
    assert lexicon.Noun("car", "cars", "Auto", "Autos", 2).german_form(True, "dat") == "Autos"
    assert lexicon.Adjective("quick", "schnell").english_adverb == "quickly"


def test_lexicon_and_draws_are_deterministic():
    assert lexicon.build_lexicon(3) == lexicon.build_lexicon(3)
    assert lexicon.build_lexicon(3).nouns != lexicon.build_lexicon(4).nouns
    first, second = lexicon.Draw(7), lexicon.Draw(7, buffer_size=5)  # buffer refills must not matter
    assert [first.below(1000) for _ in range(20)] == [second.below(1000) for _ in range(20)]
