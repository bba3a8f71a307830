"""The built-in corpus: a synthetic, rule-based English -> pseudo-German parallel corpus.

It exists so that the default run works on a fresh offline machine. It is NOT real data: the content
words are generated (see lexicon.py) and a small grammar turns one random sentence structure into an
English sentence and its only correct German-like translation. The rules are those a translation
model has to learn on real data, on a small scale:

- word order: German verb-second main clauses (with subject-verb inversion after a fronted adverb or
  clause), verb-final subordinate and relative clauses, clause-final infinitives and participles
  ("will see the dog" -> "wird den Hund sehen"), "nicht" placed after the object;
- agreement and inflection: articles by gender, number and case (nominative / accusative / dative,
  chosen by the verb or preposition), adjective endings (weak, mixed, strong), verb endings by
  person and number, noun plural classes, the dative plural -n;
- different lengths: do-support and "not" vs. "nicht", "to the" -> "zum", noun compounds written as
  one word, commas before German subordinate clauses.

Generation is deterministic: the same arguments give bit-identical splits on every machine.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, TypeVar

from transformer_jax.data.builtin import lexicon as lx
from transformer_jax.data.builtin.lexicon import Draw, Lexicon

Pair = tuple[str, str]
T = TypeVar("T")
MIN_WORDS = 3
MAX_WORDS = 30
TENSES = ("present", "past", "future", "perfect", "can", "must")
TENSE_WEIGHTS = (0.3, 0.25, 0.15, 0.15, 0.08, 0.07)
TIME_OF_TENSE = {"present": "present", "past": "past", "future": "future", "perfect": "past",
                 "can": "present", "must": "present"}


@dataclasses.dataclass(frozen=True)
class Phrase:
    """A phrase in both languages; `agreement` is the person/number it imposes as a subject."""

    english: list[str]
    german: list[str]
    agreement: str = "3sg"
    gender: int = 0  # German gender, or lexicon.PLURAL, for relative pronouns
    full: bool = False  # a noun phrase with a head noun (may take a relative clause)


@dataclasses.dataclass(frozen=True)
class Clause:
    """One clause's parts, before they are put in English or German order."""

    subject: Phrase
    verb: lx.Verb
    tense: str
    negated: bool
    object: Phrase | None = None
    adverb: lx.Adjective | None = None
    prepositional: Phrase | None = None
    time: tuple[str, str] | None = None
    complement: Phrase | None = None  # a that-clause (clausal verbs) or a relative clause


def _weighted(draw: Draw, items: tuple[T, ...], weights: tuple[float, ...]) -> T:
    """One item with probability proportional to its weight (zero weight: never)."""
    threshold, total = draw.uniform() * sum(weights), 0.0
    for item, weight in zip(items, weights):
        total += weight
        if threshold < total:
            return item
    return items[max(i for i, w in enumerate(weights) if w > 0)]


def _pronoun(draw: Draw, case: str) -> Phrase:
    english, german, agreement = draw.choice(lx.PRONOUNS)
    return Phrase([english[0 if case == "nom" else 1]], [german[lx.CASES.index(case)]], agreement)


def _noun_phrase(draw: Draw, lexicon: Lexicon, case: str) -> Phrase:
    """Determiner, adjectives and noun (or a compound noun), inflected for `case`."""
    plural = draw.chance(0.4)
    if plural:
        determiner = _weighted(draw, ("the", "this", "my", "your", "bare", "number"), (.35, .1, .08, .07, .2, .2))
    else:
        determiner = _weighted(draw, ("the", "a", "this", "my", "your"), (.4, .3, .1, .1, .1))
    noun = draw.choice(lexicon.nouns)
    column = lx.PLURAL if plural else noun.gender
    english, german = [], []
    if determiner == "number":
        english_number, german_number = draw.choice(lx.NUMBERS)
        english.append(english_number)
        german.append(german_number)
    elif determiner != "bare":
        english.append({"this": "these"}.get(determiner, determiner) if plural else determiner)
        german.append(lx.DE_DETERMINERS[determiner][case][column])
    for _ in range(_weighted(draw, (0, 1, 2), (0.6, 0.3, 0.1))):
        adjective = draw.choice(lexicon.adjectives)
        if determiner in lx.ADJECTIVE_ENDINGS:
            ending = lx.ADJECTIVE_ENDINGS[determiner][case][column]
        else:
            ending = lx.STRONG_PLURAL_ENDINGS[case]
        english.append(adjective.english)
        german.append(adjective.german + ending)
    head = noun.german_form(plural, case)
    if draw.chance(0.12):
        modifier = draw.choice(lexicon.nouns)
        english.append(modifier.english)
        head = modifier.german + head.lower()  # German writes noun compounds as one word
    english.append(noun.english_plural if plural else noun.english)
    german.append(head)
    return Phrase(english, german, "3pl" if plural else "3sg", column, full=True)


def _argument(draw: Draw, lexicon: Lexicon, case: str, pronoun_rate: float) -> Phrase:
    """A subject, object or prepositional object: pronoun, name or noun phrase."""
    roll = draw.uniform()
    if roll < pronoun_rate:
        return _pronoun(draw, case)
    if roll < pronoun_rate + 0.1:
        name = draw.choice(lexicon.names)
        return Phrase([name], [name])
    return _noun_phrase(draw, lexicon, case)


def _prepositional(draw: Draw, lexicon: Lexicon) -> Phrase:
    english, german, case = draw.choice(lx.PREPOSITIONS)
    argument = _argument(draw, lexicon, case, pronoun_rate=0.1)
    words = argument.german
    contraction = lx.CONTRACTIONS.get((german, words[0]))
    german_words = [contraction] + words[1:] if contraction else [german] + words
    return Phrase([english] + argument.english, german_words)


def _relative_clause(draw: Draw, lexicon: Lexicon, antecedent: Phrase) -> Phrase:
    """Relative clause on an object: "that sleeps" -> ", der schläft" (verb-final, pronoun by gender)."""
    kind = "transitive" if draw.chance(0.6) else "intransitive"
    verb = draw.choice(lexicon.verbs[kind])
    past = draw.chance(0.5)
    agreement = antecedent.agreement
    english_verb = verb.english_past if past else (verb.english_3sg if agreement == "3sg" else verb.english)
    german_verb = verb.german_past(agreement) if past else verb.german_present(agreement)
    english, german = ["that", english_verb], [",", lx.RELATIVE_PRONOUNS[antecedent.gender]]
    if kind == "transitive":
        obj = _noun_phrase(draw, lexicon, "acc")
        english += obj.english
        german += obj.german
    return Phrase(english, german + [german_verb])


def _clause(draw: Draw, lexicon: Lexicon, allow_complement: bool) -> Clause:
    """Draw a clause structure; complements (that-clauses, relative clauses) only if allowed."""
    kind = _weighted(draw, ("transitive", "intransitive", "clausal"),
                     (0.7, 0.2, 0.1 if allow_complement else 0.0))
    verb = draw.choice(lexicon.verbs[kind])
    tense = _weighted(draw, TENSES, TENSE_WEIGHTS)
    subject = _argument(draw, lexicon, "nom", pronoun_rate=0.25)
    negated = draw.chance(0.15)
    if kind == "clausal":
        complement = _clause(draw, lexicon, allow_complement=False)
        english, german = _subordinate(complement, "that", "dass")
        return Clause(subject, verb, tense, negated, complement=Phrase(english, [","] + german))
    obj = _argument(draw, lexicon, "acc", pronoun_rate=0.15) if kind == "transitive" else None
    adverb = draw.choice(lexicon.adjectives) if draw.chance(0.2) else None
    prepositional = _prepositional(draw, lexicon) if draw.chance(0.3) else None
    time = draw.choice(lx.TIME_ADVERBS[TIME_OF_TENSE[tense]]) if draw.chance(0.2) else None
    clause = Clause(subject, verb, tense, negated, obj, adverb, prepositional, time)
    # A relative clause only where German and English both end the clause with the object.
    bare = not (negated or adverb or prepositional or time) and tense in ("present", "past")
    if allow_complement and obj is not None and obj.full and bare and draw.chance(0.4):
        clause = dataclasses.replace(clause, complement=_relative_clause(draw, lexicon, obj))
    return clause


def _english_verb(clause: Clause, question: bool) -> list[str]:
    """English verb group: auxiliary (or do-support), "not", main verb."""
    verb, third = clause.verb, clause.subject.agreement == "3sg"
    not_ = ["not"] if clause.negated else []
    if clause.tense in ("present", "past") and (clause.negated or question):
        do = "did" if clause.tense == "past" else ("does" if third else "do")
        return [do] + not_ + [verb.english]
    if clause.tense == "present":
        return [verb.english_3sg if third else verb.english]
    if clause.tense == "past":
        return [verb.english_past]
    if clause.tense == "perfect":
        return ["has" if third else "have"] + not_ + [verb.english_past]
    if clause.tense == "can" and clause.negated and not question:
        return ["cannot", verb.english]
    return [{"future": "will", "must": "must", "can": "can"}[clause.tense]] + not_ + [verb.english]


def _german_verb(clause: Clause) -> tuple[str, list[str]]:
    """German finite verb and the non-finite verbs that close the clause."""
    verb, agreement = clause.verb, clause.subject.agreement
    if clause.tense == "present":
        return verb.german_present(agreement), []
    if clause.tense == "past":
        return verb.german_past(agreement), []
    finite = lx.DE_AUXILIARIES[clause.tense][agreement]
    return finite, [verb.german_participle if clause.tense == "perfect" else verb.german_infinitive]


def _english_rest(clause: Clause, with_time: bool = True) -> list[str]:
    """Everything after the English verb group: object, PP, adverb, time, complement."""
    words = list(clause.object.english) if clause.object else []
    words += clause.prepositional.english if clause.prepositional else []
    words += [clause.adverb.english_adverb] if clause.adverb else []
    words += [clause.time[0]] if clause.time and with_time else []
    return words + (clause.complement.english if clause.complement else [])


def _german_middle(clause: Clause, with_time: bool) -> list[str]:
    """The German middle field: time, object, nicht, adverb, PP (verbs not included)."""
    words = [clause.time[1]] if clause.time and with_time else []
    words += clause.object.german if clause.object else []
    words += ["nicht"] if clause.negated else []
    words += [clause.adverb.german] if clause.adverb else []
    return words + (clause.prepositional.german if clause.prepositional else [])


def _main(clause: Clause, front_time: bool) -> tuple[list[str], list[str]]:
    """Declarative main clause; a fronted time adverb inverts German subject and verb."""
    front_time = front_time and clause.time is not None
    finite, closing = _german_verb(clause)
    english = clause.subject.english + _english_verb(clause, False) + _english_rest(clause, not front_time)
    rest = _german_middle(clause, with_time=not front_time) + closing + _complement(clause)
    if front_time:
        return [clause.time[0]] + english, [clause.time[1], finite] + clause.subject.german + rest
    return english, clause.subject.german + [finite] + rest


def _complement(clause: Clause) -> list[str]:
    return clause.complement.german if clause.complement else []


def _inverted(clause: Clause, front: list[str]) -> list[str]:
    """German main clause after a fronted subordinate clause: verb first, then the subject."""
    finite, closing = _german_verb(clause)
    return front + [finite] + clause.subject.german + _german_middle(clause, True) + closing + _complement(clause)


def _subordinate(clause: Clause, english_conjunction: str, german_conjunction: str) -> tuple[list[str], list[str]]:
    """Subordinate clause: German puts all verbs last, the finite one at the very end."""
    finite, closing = _german_verb(clause)
    english = [english_conjunction] + clause.subject.english + _english_verb(clause, False) + _english_rest(clause)
    german = [german_conjunction] + clause.subject.german + _german_middle(clause, True) + closing + [finite]
    return english, german


def _question(clause: Clause) -> tuple[list[str], list[str]]:
    """Yes/no question: English fronts the auxiliary (do-support), German the finite verb."""
    finite, closing = _german_verb(clause)
    verb = _english_verb(clause, question=True)
    english = verb[:1] + clause.subject.english + verb[1:] + _english_rest(clause)
    german = [finite] + clause.subject.german + _german_middle(clause, True) + closing + _complement(clause)
    return english + ["?"], german + ["?"]


def _sentence_parts(draw: Draw, lexicon: Lexicon) -> tuple[list[str], list[str]]:
    """One sentence pattern: simple, with a subordinate clause (after or fronted), coordinated, question."""
    pattern = _weighted(draw, ("simple", "subordinate", "fronted", "coordinated", "question"),
                        (0.45, 0.15, 0.08, 0.14, 0.18))
    clause = _clause(draw, lexicon, allow_complement=pattern != "fronted")
    if pattern == "question":
        return _question(clause)
    if pattern in ("subordinate", "fronted"):
        english_conjunction, german_conjunction = draw.choice(lx.SUBORDINATORS)
        inner = _clause(draw, lexicon, allow_complement=False)
        if english_conjunction == "when" and inner.tense in ("past", "perfect"):
            german_conjunction = "als"  # German "when" in the past is "als", otherwise "wenn"
        sub_english, sub_german = _subordinate(inner, english_conjunction, german_conjunction)
        if pattern == "fronted":
            return (sub_english + [","] + _main(clause, False)[0] + ["."],
                    _inverted(clause, sub_german + [","]) + ["."])
        english, german = _main(clause, draw.chance(0.5))
        return english + sub_english + ["."], german + [","] + sub_german + ["."]
    english, german = _main(clause, draw.chance(0.5))
    if pattern == "coordinated":
        second_english, second_german = _main(_clause(draw, lexicon, allow_complement=False), False)
        if draw.chance(0.5):
            return english + ["and"] + second_english + ["."], german + ["und"] + second_german + ["."]
        return english + [",", "but"] + second_english + ["."], german + [",", "aber"] + second_german + ["."]
    return english + ["."], german + ["."]


def _join(words: list[str]) -> str:
    """Words to a sentence: punctuation attached to the word before, first letter capitalized."""
    text = " ".join(words).replace(" ,", ",").replace(" .", ".").replace(" ?", "?")
    return text[:1].upper() + text[1:]


def generate_pairs(count: int, seed: int = 0, lexicon: Lexicon | None = None, unique: bool = True) -> list[Pair]:
    """`count` sentence pairs of MIN_WORDS..MAX_WORDS words; `unique`: no English sentence twice."""
    lexicon = lexicon or lx.build_lexicon(seed)
    draw = Draw(seed + 1)
    seen: set[str] = set()
    pairs = []
    while len(pairs) < count:
        english_words, german_words = _sentence_parts(draw, lexicon)
        english, german = _join(english_words), _join(german_words)
        if (unique and english in seen) or not _length_ok(english) or not _length_ok(german):
            continue
        seen.add(english)
        pairs.append((english, german))
    return pairs


def _length_ok(sentence: str) -> bool:
    return MIN_WORDS <= len(sentence.split()) <= MAX_WORDS


def builtin_corpus(num_train: int = 50_000, num_dev: int = 1_000, num_test: int = 2_000,
                   seed: int = 0, splits: Sequence[str] = ("train", "dev", "test")) -> dict[str, list[Pair]]:
    """The synthetic EN->DE corpus as {split: list of (english, german) pairs} for each of `splits`.

    Test sentences are drawn first, then dev, then train, each excluding all sentences before it: the
    splits are disjoint, and dev/test do not change when only `num_train` does. Only the sentences up
    to the end of the last split asked for are drawn (the test split alone takes a 26th of the time).
    """
    ends = {"test": num_test, "dev": num_test + num_dev, "train": num_test + num_dev + num_train}
    starts = {"test": 0, "dev": num_test, "train": num_test + num_dev}
    lexicon = lx.build_lexicon(seed)
    pairs = generate_pairs(max(ends[split] for split in splits), seed, lexicon)
    return {split: pairs[starts[split]:ends[split]] for split in splits}
