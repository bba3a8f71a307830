"""Lexicon of the built-in synthetic EN->DE corpus: generated word pairs and their inflections.

Everything here is synthetic. English-like and German-like content words are built from syllables
by a seeded generator, so the vocabulary needs no download and is identical on every machine.
Function words (articles, pronouns, prepositions, auxiliaries, numbers) are real German and English,
which keeps the sentences readable. The two sides never share a word except proper names, so a
system that copies its input scores near zero BLEU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

# Agreement keys: person and number of a subject. Plural "you" is left out on purpose: English
# "you" always means German "du", so every English sentence has exactly one translation.
AGREEMENTS = ("1sg", "2sg", "3sg", "1pl", "3pl")
GENDERS = ("m", "f", "n")
PLURAL = 3  # index of the plural column in the German article and ending tables
CASES = ("nom", "acc", "dat")

EN_ONSETS = "b bl br d dr f fl fr g gl gr h j k l m n p pl pr r s sk sl sp st t tr v w".split()
EN_VOWELS = "a e i o u ai ea oo".split()
EN_CODAS = "b d ft g k l m n nd nt p r rk sk st t x".split()
DE_ONSETS = "b bl br d dr f fl fr g gl gr h k kl kr l m n pf r s sch schl schm schw sp st t tr w z zw".split()
DE_VOWELS = "a e i o u ä ö ü ei au eu ie".split()
DE_CODAS = "ch ck f g k l m n ng nk pf r rg rm rn sch t tz".split()
# German verb stems avoid t/z endings so the weak conjugation needs no e-insertion rules.
DE_VERB_CODAS = "ch ck f g k l m n ng nk pf r rg rm rn".split()
NAME_ONSETS = "B D F G H J K L M N P R S T V Z".split()
NAME_VOWELS = "a e i o".split()
NAME_CONSONANTS = "d l m n r s t v".split()

GERMAN_PLURAL_SUFFIXES = {"m": ("e", "e", "er", "s"), "f": ("en", "en", "en", "e"), "n": ("er", "e", "s", "e")}
PRESENT_ENDINGS = {"1sg": "e", "2sg": "st", "3sg": "t", "1pl": "en", "3pl": "en"}
PAST_ENDINGS = {"1sg": "te", "2sg": "test", "3sg": "te", "1pl": "ten", "3pl": "ten"}

# Closed-class words. Rows of German tables are indexed by gender (m, f, n) then plural.
DE_DETERMINERS = {
    "the": {"nom": ("der", "die", "das", "die"), "acc": ("den", "die", "das", "die"),
            "dat": ("dem", "der", "dem", "den")},
    "this": {"nom": ("dieser", "diese", "dieses", "diese"), "acc": ("diesen", "diese", "dieses", "diese"),
             "dat": ("diesem", "dieser", "diesem", "diesen")},
    "a": {"nom": ("ein", "eine", "ein", ""), "acc": ("einen", "eine", "ein", ""),
          "dat": ("einem", "einer", "einem", "")},
    "my": {"nom": ("mein", "meine", "mein", "meine"), "acc": ("meinen", "meine", "mein", "meine"),
           "dat": ("meinem", "meiner", "meinem", "meinen")},
    "your": {"nom": ("dein", "deine", "dein", "deine"), "acc": ("deinen", "deine", "dein", "deine"),
             "dat": ("deinem", "deiner", "deinem", "deinen")},
}
WEAK_ENDINGS = {"nom": ("e", "e", "e", "en"), "acc": ("en", "e", "e", "en"), "dat": ("en", "en", "en", "en")}
MIXED_ENDINGS = {"nom": ("er", "e", "es", "en"), "acc": ("en", "e", "es", "en"), "dat": ("en", "en", "en", "en")}
STRONG_PLURAL_ENDINGS = {"nom": "e", "acc": "e", "dat": "en"}
ADJECTIVE_ENDINGS = {"the": WEAK_ENDINGS, "this": WEAK_ENDINGS, "a": MIXED_ENDINGS, "my": MIXED_ENDINGS,
                     "your": MIXED_ENDINGS}
RELATIVE_PRONOUNS = ("der", "die", "das", "die")

# (English nominative, accusative/dative), (German nominative, accusative, dative), agreement.
PRONOUNS = (
    (("I", "me"), ("ich", "mich", "mir"), "1sg"),
    (("you", "you"), ("du", "dich", "dir"), "2sg"),
    (("he", "him"), ("er", "ihn", "ihm"), "3sg"),
    (("she", "her"), ("sie", "sie", "ihr"), "3sg"),
    (("it", "it"), ("es", "es", "ihm"), "3sg"),
    (("we", "us"), ("wir", "uns", "uns"), "1pl"),
    (("they", "them"), ("sie", "sie", "ihnen"), "3pl"),
)
PREPOSITIONS = (
    ("with", "mit", "dat"), ("from", "von", "dat"), ("near", "bei", "dat"), ("after", "nach", "dat"),
    ("behind", "hinter", "dat"), ("under", "unter", "dat"), ("to", "zu", "dat"), ("for", "für", "acc"),
    ("without", "ohne", "acc"), ("against", "gegen", "acc"), ("through", "durch", "acc"),
)
CONTRACTIONS = {("zu", "dem"): "zum", ("zu", "der"): "zur", ("bei", "dem"): "beim", ("von", "dem"): "vom"}
NUMBERS = tuple(zip("two three four five six seven eight nine ten eleven twelve".split(),
                    "zwei drei vier fünf sechs sieben acht neun zehn elf zwölf".split()))
TIME_ADVERBS = {
    "present": (("today", "heute"), ("now", "jetzt")),
    "past": (("yesterday", "gestern"), ("earlier", "früher")),
    "future": (("tomorrow", "morgen"), ("later", "später")),
}
# German finite auxiliaries by agreement key.
DE_AUXILIARIES = {
    "future": {"1sg": "werde", "2sg": "wirst", "3sg": "wird", "1pl": "werden", "3pl": "werden"},
    "perfect": {"1sg": "habe", "2sg": "hast", "3sg": "hat", "1pl": "haben", "3pl": "haben"},
    "can": {"1sg": "kann", "2sg": "kannst", "3sg": "kann", "1pl": "können", "3pl": "können"},
    "must": {"1sg": "muss", "2sg": "musst", "3sg": "muss", "1pl": "müssen", "3pl": "müssen"},
}
SUBORDINATORS = (("because", "weil"), ("although", "obwohl"), ("before", "bevor"), ("while", "während"),
                 ("when", "wenn"))
FUNCTION_WORDS_EN = frozenset(
    "the a this these my your not do does did will has have can cannot must that and but".split()
    + [w for pair, _, _ in PRONOUNS for w in pair] + [p[0] for p in PREPOSITIONS]
    + [n[0] for n in NUMBERS] + [w for pairs in TIME_ADVERBS.values() for w, _ in pairs]
    + [s[0] for s in SUBORDINATORS]
)
FUNCTION_WORDS_DE = frozenset(
    [w for table in DE_DETERMINERS.values() for row in table.values() for w in row if w]
    + [w for _, forms, _ in PRONOUNS for w in forms] + [p[1] for p in PREPOSITIONS]
    + list(CONTRACTIONS.values()) + [n[1] for n in NUMBERS]
    + [w for pairs in TIME_ADVERBS.values() for _, w in pairs]
    + [w for table in DE_AUXILIARIES.values() for w in table.values()]
    + [s[1] for s in SUBORDINATORS] + "und aber nicht dass als".split()
)


class Draw:
    """Seeded uniform draws served from a buffer: numpy's Generator at the cost of a list lookup."""

    def __init__(self, seed: int, buffer_size: int = 1 << 16):
        self._generator = np.random.default_rng(seed)
        self._buffer_size = buffer_size
        self._buffer: list[float] = []
        self._next = 0

    def uniform(self) -> float:
        """One float in [0, 1)."""
        if self._next == len(self._buffer):
            self._buffer = self._generator.random(self._buffer_size).tolist()
            self._next = 0
        self._next += 1
        return self._buffer[self._next - 1]

    def below(self, n: int) -> int:
        """An integer in [0, n)."""
        return int(self.uniform() * n)

    def choice(self, items: Sequence[T]) -> T:
        """One item, uniformly."""
        return items[self.below(len(items))]

    def chance(self, probability: float) -> bool:
        """True with the given probability."""
        return self.uniform() < probability


@dataclasses.dataclass(frozen=True)
class Noun:
    """A noun pair; German nouns carry a gender and a plural class."""

    english: str
    english_plural: str
    german: str
    german_plural: str
    gender: int  # index into GENDERS

    def german_form(self, plural: bool, case: str) -> str:
        """German surface form; the dative plural adds -n unless the plural already ends in n or s."""
        if not plural:
            return self.german
        if case == "dat" and self.german_plural[-1] not in "ns":
            return self.german_plural + "n"
        return self.german_plural


@dataclasses.dataclass(frozen=True)
class Verb:
    """A regular verb pair; `kind` is "transitive", "intransitive" or "clausal" (takes a that-clause)."""

    english: str
    english_3sg: str
    english_past: str
    german_stem: str
    kind: str

    def german_present(self, agreement: str) -> str:
        """Finite present tense form."""
        return self.german_stem + PRESENT_ENDINGS[agreement]

    def german_past(self, agreement: str) -> str:
        """Finite past tense form (weak conjugation)."""
        return self.german_stem + PAST_ENDINGS[agreement]

    @property
    def german_infinitive(self) -> str:
        """Infinitive, used after werden/können/müssen."""
        return self.german_stem + "en"

    @property
    def german_participle(self) -> str:
        """Past participle, used after haben."""
        return "ge" + self.german_stem + "t"


@dataclasses.dataclass(frozen=True)
class Adjective:
    """An adjective pair; the English adverb adds -ly, the German adverb is the bare stem."""

    english: str
    german: str

    @property
    def english_adverb(self) -> str:
        """Manner adverb ("quick" -> "quickly")."""
        return self.english + "ly"


@dataclasses.dataclass(frozen=True)
class Lexicon:
    """All generated open-class words of the built-in corpus."""

    nouns: tuple[Noun, ...]
    verbs: dict[str, tuple[Verb, ...]]
    adjectives: tuple[Adjective, ...]
    names: tuple[str, ...]


def _syllables(draw: Draw, onsets: list[str], vowels: list[str], codas: list[str], count: int) -> str:
    """`count` open syllables and a closing coda, e.g. "bra" + "tosk"."""
    body = "".join(draw.choice(onsets) + draw.choice(vowels) for _ in range(count))
    return body + draw.choice(codas)


def _english_suffixed(stem: str, suffix: str) -> str:
    """English spelling of stem + "s" or "ed" (boxes, walked)."""
    if suffix == "s" and stem.endswith(("s", "x", "sh")):
        return stem + "es"
    return stem + suffix


class _UniqueWords:
    """Rejection sampling so that no surface form is shared between lemmas or between the sides."""

    def __init__(self):
        self.english = set(FUNCTION_WORDS_EN)
        self.german = {w.lower() for w in FUNCTION_WORDS_DE}

    def claim(self, english: Sequence[str], german: Sequence[str]) -> bool:
        """Reserve the forms and return True if none is taken (on either side)."""
        english_forms = {w.lower() for w in english}
        german_forms = {w.lower() for w in german}
        forms = english_forms | german_forms
        if len(forms) < len(english_forms) + len(german_forms):
            return False
        if any(w in self.english or w in self.german for w in forms):
            return False
        self.english |= english_forms
        self.german |= german_forms
        return True


def _make_noun(draw: Draw, words: _UniqueWords) -> Noun:
    while True:
        english = _syllables(draw, EN_ONSETS, EN_VOWELS, EN_CODAS, 1 + draw.below(2))
        stem = _syllables(draw, DE_ONSETS, DE_VOWELS, DE_CODAS, 1 + draw.below(2)).capitalize()
        gender = draw.below(3)
        noun = Noun(english, _english_suffixed(english, "s"), stem,
                    stem + draw.choice(GERMAN_PLURAL_SUFFIXES[GENDERS[gender]]), gender)
        if words.claim([noun.english, noun.english_plural],
                       [noun.german, noun.german_plural, noun.german_form(True, "dat")]):
            return noun


def _make_verb(draw: Draw, words: _UniqueWords, kind: str) -> Verb:
    while True:
        english = _syllables(draw, EN_ONSETS, EN_VOWELS, EN_CODAS, 1 + draw.below(2))
        stem = _syllables(draw, DE_ONSETS, DE_VOWELS, DE_VERB_CODAS, 1 + draw.below(2))
        verb = Verb(english, _english_suffixed(english, "s"), _english_suffixed(english, "ed"), stem, kind)
        german = sorted({verb.german_present(a) for a in AGREEMENTS} | {verb.german_past(a) for a in AGREEMENTS})
        if words.claim([english, verb.english_3sg, verb.english_past],
                       german + [verb.german_infinitive, verb.german_participle]):
            return verb


def _make_adjective(draw: Draw, words: _UniqueWords) -> Adjective:
    while True:
        english = _syllables(draw, EN_ONSETS, EN_VOWELS, EN_CODAS, 1 + draw.below(2))
        stem = _syllables(draw, DE_ONSETS, DE_VOWELS, DE_CODAS, 1 + draw.below(2))
        adjective = Adjective(english, stem)
        if words.claim([english, adjective.english_adverb], [stem] + [stem + e for e in ("e", "en", "er", "es")]):
            return adjective


def _make_name(draw: Draw, words: _UniqueWords) -> str:
    while True:
        name = draw.choice(NAME_ONSETS) + _syllables(draw, NAME_CONSONANTS, NAME_VOWELS, ["", "n", "s"], 1)
        name = name[0] + draw.choice(NAME_VOWELS) + name[1:]
        # Proper names are the one thing both sides share, as in real translation data.
        if name.lower() not in words.english and name.lower() not in words.german:
            words.english.add(name.lower())
            words.german.add(name.lower())
            return name


def build_lexicon(seed: int = 0, num_nouns: int = 320, num_verbs: tuple[int, int, int] = (140, 40, 20),
                  num_adjectives: int = 140, num_names: int = 40) -> Lexicon:
    """Generate the lexicon; `num_verbs` counts transitive, intransitive and clausal verbs."""
    draw = Draw(seed)
    words = _UniqueWords()
    nouns = tuple(_make_noun(draw, words) for _ in range(num_nouns))
    verbs = {kind: tuple(_make_verb(draw, words, kind) for _ in range(count))
             for kind, count in zip(("transitive", "intransitive", "clausal"), num_verbs)}
    adjectives = tuple(_make_adjective(draw, words) for _ in range(num_adjectives))
    names = tuple(_make_name(draw, words) for _ in range(num_names))
    return Lexicon(nouns, verbs, adjectives, names)
