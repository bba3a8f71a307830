"""What a search looks for, as one typed object: mode, beam size, length penalty, length limit, sampling.

The defaults are the paper's (section 6.1): beam search with beam 4, length penalty alpha 0.6, outputs
at most 50 tokens longer than their source. A run's `eval` section (and `data.eval_batch_size`)
builds one (`transformer_jax.config.schema.decode_options`); `eval.py`'s flags override it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Mapping

import numpy as np

from transformer_jax.base import FLAGS, KEYWORDS, Bound, check_declared, declared, declared_limits
from transformer_jax.errors import ConfigError

DecodeMode = Literal["beam", "greedy", "sample"]
# The largest seed (sampling; training.seed too): JAX's random keys and NumPy's generators take a 64-bit signed one.
MAX_SEED = 2**63 - 1
# The mode each search setting is for: given with another mode it would change nothing, so it is refused.
SETTING_MODES = {"beam_size": "beam", "alpha": "beam", "seed": "sample", "temperature": "sample", "top_k": "sample",
                 "top_p": "sample"}
# The largest beam_size, top_k and max_extra_length: decoding adds them to int32 lengths and indices.
MAX_SEARCH_INT = 2**30
# The smallest normal float32: accelerators and XLA:CPU flush smaller (subnormal) numbers to zero.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)

# What each search setting admits. Decoding computes in float32: a float is checked as it will be there (1e-50 is 0,
# 1e39 is inf). max_extra_length is positive: with 0 an empty source would leave its search no step, not even EOS.
SEARCH_COUNT = Bound(1, MAX_SEARCH_INT, wording=f"a positive integer, at most 2**30 = {MAX_SEARCH_INT}",
                     short="[1, 2**30]")
TOP_K = Bound(0, MAX_SEARCH_INT, wording=f"0 (keep every token) or a positive integer, at most 2**30 = "
              f"{MAX_SEARCH_INT}", short="[0, 2**30]")
ALPHA = Bound(0, math.inf, open_high=True, in_float32=True, short=">= 0, finite in float32",
              wording=">= 0 and finite in float32 (below 3.4e38; 0 turns the length penalty off)")
TEMPERATURE = Bound(FLOAT32_TINY, math.inf, open_high=True, in_float32=True, short="[1.2e-38, 3.4e38]",
                    wording="a normal positive float32 (1.2e-38 to 3.4e38; mode=greedy takes the most likely token)")
TOP_P = Bound(0, 1, open_low=True, in_float32=True, short="(0, 1]",
              wording="in (0, 1] and not 0 in float32 (1 keeps every token)")
SEED = Bound(0, MAX_SEED, wording="an integer in [0, 2**63 - 1]", short="[0, 2**63 - 1]")


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless `condition` holds."""
    if not condition:
        raise ConfigError(message)


def spelled(name: str, value: Any = None, as_flag: bool = False) -> str:
    """A setting as a Python caller writes it (`top_k`, `mode='sample'`) or, `as_flag`, the command line
    (`--top_k`, `--mode=sample`)."""
    if value is None:
        return FLAGS.target(name) if as_flag else name
    return (FLAGS if as_flag else KEYWORDS).named(name, value)


def is_python_number(value: Any) -> bool:
    """True for a Python number; traced values (decoding inside a caller's jit) are not checked."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_search_settings(**settings: Any) -> None:
    """The search functions' own arguments (beam_search's beam_size, ...) checked against DecodeOptions' declared
    limits; a traced value (decoding inside a caller's jit) is not checked."""
    check_declared(DecodeOptions, {name: value for name, value in settings.items() if is_python_number(value)})


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """Search settings, validated on construction (a bad value raises ConfigError naming it); each field's meaning
    and limit are declared beside it (the run's eval section and eval.py's flags read them)."""

    mode: DecodeMode = declared("beam", '"beam" (beam search, the best hypothesis), "greedy" or "sample".')
    beam_size: int = declared(4, "hypotheses kept per sentence (mode beam).", SEARCH_COUNT)
    alpha: float = declared(0.6, "length penalty exponent, lp(Y) = ((5 + |Y|) / 6)^alpha; 0 turns it off (mode beam).",
                            ALPHA)
    max_extra_length: int = declared(50, "each output has at most (its source length + max_extra_length) tokens.",
                                     SEARCH_COUNT)
    temperature: float = declared(1.0, "sampling temperature (mode sample).", TEMPERATURE)
    top_k: int = declared(0, "sample among the k most likely tokens; 0 keeps all (mode sample).", TOP_K)
    top_p: float = declared(1.0, "nucleus mass; 1 keeps all (mode sample).", TOP_P)
    seed: int = declared(0, "random seed of sampling (mode sample).", SEED)

    def __post_init__(self) -> None:
        check_declared(DecodeOptions, {field.name: getattr(self, field.name) for field in dataclasses.fields(self)})

    @classmethod
    def allowed(cls, name: str) -> str:
        """What field `name` admits, in a few characters ("[1, 2**30]", "beam, greedy, sample"): its declared bound
        or choices (the command line's help reads it)."""
        _, bound, choices = declared_limits(cls)[name]
        return bound.short if bound is not None else ", ".join(map(str, choices))

    @classmethod
    def choices(cls, name: str) -> tuple[Any, ...]:
        """The values field `name` declares as its choices ("beam", "greedy", "sample" for `mode`)."""
        return declared_limits(cls)[name][2]

    def replace(self, **changes: Any) -> DecodeOptions:
        """A copy with some fields changed (None values are ignored; validated again)."""
        unknown = set(changes) - {field.name for field in dataclasses.fields(self)}
        require(not unknown, f"unknown decoding option(s) {sorted(unknown)}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def override(self, settings: Mapping[str, Any], as_flags: bool = False) -> DecodeOptions:
        """A copy with the settings a user gave (None: not given) applied. A setting of another mode than the
        one that runs would change nothing: it is refused, in one line naming it as a keyword argument or
        (`as_flags`) as the command line's flag."""
        given = {name: value for name, value in settings.items() if value is not None}
        unknown = set(given) - {field.name for field in dataclasses.fields(self)}
        require(not unknown, f"unknown decoding option(s) {sorted(unknown)}")
        check_declared(DecodeOptions, given, FLAGS if as_flags else KEYWORDS)  # named as the caller wrote them
        options = self.replace(**given)
        for name in given:
            belongs = SETTING_MODES.get(name, options.mode)
            mode, other = (spelled("mode", value, as_flags) for value in (belongs, options.mode))
            require(belongs == options.mode,
                    f"{spelled(name, as_flag=as_flags)} applies to {mode}, not {other}; drop it, or pass {mode}")
        return options

    def settings(self) -> dict[str, Any]:
        """The fields that mean something for this mode (`override` takes them back unchanged)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if SETTING_MODES.get(field.name, self.mode) == self.mode}

    def describe(self) -> str:
        """How a translation is produced, in words, e.g. 'beam search (beam 4, alpha 0.6)'."""
        if self.mode == "beam":
            return f"beam search (beam {self.beam_size}, alpha {self.alpha})"
        if self.mode == "greedy":
            return "greedy decoding"
        return (f"sampling (seed {self.seed}, temperature {self.temperature}, top-k {self.top_k}, "
                f"top-p {self.top_p})")
