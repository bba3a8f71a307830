"""How a setting declares its limits, and how a refusal names it.

A setting is declared once, as a dataclass field (`declared`): its default, its meaning (`help`) and what it admits,
a `Bound` on numbers or the choices of its `Literal` type (`declared_limits` reads them back). The owner's checks
(`check_declared`), a run config's rows (config/settings.py), docs/configuration.md and the commands' flags all read
that one field, so a limit is written in one place.

A refusal is one ConfigError line naming the setting as the user wrote it (`Spelling`): a keyword argument
(`d_ff=-4`, KEYWORDS), a command's flag (`--beam_size=0`, FLAGS) or a run config's key with the `--config.` flag that
fixes it (`model.d_ff=-4 must be a positive integer; set --config.model.d_ff ...`, `run_keys`).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from transformer_jax.errors import ConfigError


def as_float32(value: Any) -> float:
    """`value` as float32 holds it (overflow to inf, underflow to 0); NaN for what is not a number."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return float("nan")
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


@dataclasses.dataclass(frozen=True)
class Bound:
    """The numbers a setting may take: from `low` to `high` (either end open, or absent), and the values `also`
    outside that range (-1 = automatic); `in_float32`: compared as float32 holds them (1e-50 is 0, 1e39 is inf).
    `wording` says so in a sentence ("must be ..."), `short` in a table."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    also: tuple[int, ...] = ()
    wording: str = ""
    short: str = ""
    in_float32: bool = False

    def admits(self, value: float) -> bool:
        """Whether `value` is in the range (or one of the values `also` allows)."""
        if value in self.also:
            return True
        value = as_float32(value) if self.in_float32 else value
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below


POSITIVE = Bound(0, open_low=True, wording="positive", short="> 0")
POSITIVE_INTEGER = Bound(0, open_low=True, wording="a positive integer", short="> 0")
NON_NEGATIVE = Bound(0, wording="zero or positive", short=">= 0")
FRACTION = Bound(0.0, 1.0, open_high=True, wording="in [0, 1)", short="[0, 1)")


@dataclasses.dataclass(frozen=True)
class Spelling:
    """How a refusal names a setting: as a keyword argument (`d_ff=-4`, KEYWORDS), a command's flag (`--beam_size=0`,
    FLAGS) or a key of a run config's section (`model.d_ff=-4`, with the fix `--config.model.d_ff`: `run_keys`)."""

    prefix: str = ""
    flag: str = ""  # what the fix sets: "--config.model." (nothing for keywords and flags: they name themselves)
    quoted: bool = True  # values as repr() ('pre'), or as typed on a command line (pre)

    def named(self, name: str, value: Any) -> str:
        """The setting with its value: `model.norm_position='middle'`."""
        return f"{self.prefix}{name}={value!r}" if self.quoted else f"{self.prefix}{name}={value}"

    def target(self, name: str) -> str:
        """What a user changes: `--config.model.num_heads` (`num_heads` for a keyword, `--beam_size` for a flag)."""
        return f"{self.flag or self.prefix}{name}"

    def setter(self, name: str) -> str:
        """How to change it: `set --config.model.num_heads`."""
        return f"set {self.target(name)}"

    def fix(self, name: str, how: str) -> str:
        """The end of a refusal of a run's key: `; set --config.model.d_ff {how}` ("" for keywords and flags)."""
        return f"; {self.setter(name)} {how}" if self.flag else ""


KEYWORDS = Spelling()
FLAGS = Spelling("--", quoted=False)


def run_keys(section: str) -> Spelling:
    """The spelling of a run config's `section` ("model"): `model.d_ff=-4 ...; set --config.model.d_ff ...`."""
    return Spelling(f"{section}.", f"--config.{section}.")


def declared(default: Any, help: str, bound: Bound | None = None) -> Any:  # noqa: A002 - argparse's name for it
    """A dataclass field declaring a setting: its default, its meaning (`help`) and its `bound`; choices are its
    `Literal` type's."""
    return dataclasses.field(default=default, metadata={"help": help, "bound": bound})


@functools.cache
def declared_limits(owner: type) -> dict[str, tuple[type, Bound | None, tuple[Any, ...]]]:
    """{field: (its type, its bound, its choices)} of a dataclass whose fields are `declared`."""
    hints = typing.get_type_hints(owner)
    limits = {}
    for field in dataclasses.fields(owner):
        hint = hints[field.name]
        literal = typing.get_origin(hint) is Literal
        kind = type(typing.get_args(hint)[0]) if literal else hint
        limits[field.name] = (kind, field.metadata.get("bound"), typing.get_args(hint) if literal else ())
    return limits


def is_number(value: Any, kind: type) -> bool:
    """Whether `value` is a number a setting of type `kind` takes: an int for int (not a bool), an int or a float for
    float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return kind is float or isinstance(value, int)


def check_value(name: str, value: Any, bound: Bound | None, choices: tuple[Any, ...], spelling: Spelling,
                number: bool = True) -> None:
    """Fail with one ConfigError line naming the setting as `spelling` writes it when `value` is outside its `bound`
    (or, `number` False, not a number of its type at all) or not one of its `choices`."""
    if bound is not None and not (number and bound.admits(value)):
        raise ConfigError(f"{spelling.named(name, value)} must be {bound.wording}"
                          f"{spelling.fix(name, 'to a value in that range')}")
    if choices and value not in choices:
        raise ConfigError(f"{spelling.named(name, value)} is not one of {list(choices)}"
                          f"{spelling.fix(name, 'to one of them')}")


def check_declared(owner: type, values: Mapping[str, Any], spelling: Spelling = KEYWORDS) -> None:
    """Check each of `values` ({field: value}) against the bound and choices `owner`'s field declares."""
    limits = declared_limits(owner)
    for name, value in values.items():
        kind, bound, choices = limits[name]
        check_value(name, value, bound, choices, spelling, number=is_number(value, kind))
