"""What a search looks for, as one typed object: mode, beam size, length penalty, length limit, sampling.

The defaults are the paper's (section 6.1): beam search with beam 4, length penalty alpha 0.6, outputs
at most 50 tokens longer than their source. A run's `eval` section (and `data.eval_batch_size`)
builds one (`transformer_jax.config.schema.decode_options`); `eval.py`'s flags override it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping

import numpy as np

from transformer_jax.errors import ConfigError

DecodeMode = Literal["beam", "greedy", "sample"]
MODES = ("beam", "greedy", "sample")
# The largest seed (sampling; training.seed too): JAX's random keys and NumPy's generators take a 64-bit signed one.
MAX_SEED = 2**63 - 1
# The mode each search setting is for: given with another mode it would change nothing, so it is refused.
SETTING_MODES = {"beam_size": "beam", "alpha": "beam", "seed": "sample", "temperature": "sample", "top_k": "sample",
                 "top_p": "sample"}
# The largest beam_size, top_k and max_extra_length: decoding adds them to int32 lengths and indices.
MAX_SEARCH_INT = 2**30
# The smallest normal float32: accelerators and XLA:CPU flush smaller (subnormal) numbers to zero.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless `condition` holds."""
    if not condition:
        raise ConfigError(message)


def as_float32(value: Any) -> float:
    """`value` as float32 holds it (overflow to inf, underflow to 0); NaN for what is not a number."""
    if not is_python_number(value):
        return float("nan")
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


def is_integer(value: Any) -> bool:
    """True for a Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def spelled(name: str, value: Any = None, as_flag: bool = False) -> str:
    """A setting as a Python caller writes it (`top_k`, `mode='sample'`) or, `as_flag`, the command line
    (`--top_k`, `--mode=sample`)."""
    if as_flag:
        return f"--{name}" if value is None else f"--{name}={value}"
    return name if value is None else f"{name}={value!r}"


def is_python_number(value: Any) -> bool:
    """True for a Python number; traced values (decoding inside a caller's jit) are not checked."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """Search settings, validated on construction (a bad value raises ConfigError naming it).

    Attributes:
      mode: "beam" (beam search, the best hypothesis), "greedy" or "sample".
      beam_size: hypotheses kept per sentence (mode "beam").
      alpha: length penalty exponent, lp(Y) = ((5 + |Y|) / 6)^alpha; 0 turns it off (mode "beam").
      max_extra_length: each output has at most (its source length + max_extra_length) tokens.
      temperature: sampling temperature, > 0 (mode "sample").
      top_k: sample among the k most likely tokens; 0 keeps all (mode "sample").
      top_p: nucleus mass, in (0, 1]; 1 keeps all (mode "sample").
      seed: random seed of sampling (mode "sample").
    """

    mode: DecodeMode = "beam"
    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.mode in MODES, f"decoding mode={self.mode!r} is not one of {list(MODES)}")
        for name in ("beam_size", "max_extra_length"):
            value = getattr(self, name)
            require(is_integer(value) and 1 <= value <= MAX_SEARCH_INT,
                    f"{name}={value!r} must be a positive integer, at most 2**30 = {MAX_SEARCH_INT}")
        require(is_integer(self.top_k) and 0 <= self.top_k <= MAX_SEARCH_INT,
                f"top_k={self.top_k!r} must be 0 (keep every token) or a positive integer, at most 2**30 = "
                f"{MAX_SEARCH_INT}")
        # Decoding computes in float32: a value is checked as it will be there (1e-50 is 0, 1e39 is inf).
        alpha, temperature, top_p = (as_float32(value) for value in (self.alpha, self.temperature, self.top_p))
        require(is_python_number(self.alpha) and 0 <= alpha < float("inf"),
                f"alpha={self.alpha!r} must be >= 0 and finite in float32 (below 3.4e38; 0 turns the length penalty off)")
        require(is_python_number(self.temperature) and FLOAT32_TINY <= temperature < float("inf"),
                f"temperature={self.temperature!r} must be a normal positive float32 (1.2e-38 to 3.4e38; "
                "mode=greedy takes the most likely token)")
        require(is_python_number(self.top_p) and 0 < top_p <= 1,
                f"top_p={self.top_p!r} must be in (0, 1] and not 0 in float32 (1 keeps every token)")
        require(is_integer(self.seed) and 0 <= self.seed <= MAX_SEED,
                f"seed={self.seed!r} must be an integer in [0, 2**63 - 1]")

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
