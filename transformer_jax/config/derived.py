"""Settings derived from others, that stay true after `--config.KEY=VALUE` overrides.

A derived setting (`derive`) is an ml_collections FieldReference computed from the settings it derives from each
time it is read, so that an override of one of them is taken into account (the warm-up follows the run length);
setting it itself, on the command line or in a config file, fixes it at that value. `check_derived` refuses an
explicit value that contradicts the one it stands for (a warm-up longer than the run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections

from transformer_jax.errors import ConfigError


class Derived(ml_collections.FieldReference):
    """A setting computed by `compute` from the settings `inputs` ("section.key") whenever it is read, until it is
    set (`explicit`).

    `at_most`: a setting an explicit value may not exceed, and `reason` why; `basis`: what the config was sized
    from, for the line a run prints.
    """

    def __init__(self, compute: Callable[..., Any], inputs: tuple[str, ...], references: tuple[Any, ...],
                 at_most: str = "", reason: str = "", basis: str = "") -> None:
        self.compute, self.inputs, self.references = compute, inputs, references
        self.at_most, self.reason, self.basis = at_most, reason, basis
        super().__init__(compute(*(reference.get() for reference in references)))
        self.explicit = False  # the constructor's own set() is the initial value, not the user's

    def set(self, value: Any, type_safe: bool = True) -> None:
        """Fix the setting at `value` (an override, an assignment): it is no longer derived."""
        super().set(value, type_safe)
        self.explicit = True

    def get(self) -> Any:
        """The set value, else the one computed from the inputs' values now."""
        if self.explicit:
            return super().get()
        return self.compute(*(reference.get() for reference in self.references))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # FieldReference restores only its own attributes (a deep copy would lose the inputs and the formula).
        self.__dict__.update(state)


def derive(config: ml_collections.ConfigDict, key: str, compute: Callable[..., Any], *inputs: str,
           at_most: str = "", reason: str = "", basis: str = "") -> None:
    """Make `config`'s setting `key` ("section.key") `compute(*values of inputs)`, recomputed from the inputs'
    final values (see Derived)."""
    references = tuple(config[input_key.partition(".")[0]].get_ref(input_key.partition(".")[2])
                       for input_key in inputs)
    section, _, name = key.partition(".")
    config[section][name] = Derived(compute, inputs, references, at_most, reason, basis)


def derived_settings(config: ml_collections.ConfigDict) -> dict[str, Derived]:
    """{"section.key": Derived} of the config's derived settings (none in a config built by default_config)."""
    found = {}
    for section, values in config.items():
        if isinstance(values, ml_collections.ConfigDict):
            found.update({f"{section}.{key}": value for key, value in values.items(preserve_field_references=True)
                          if isinstance(value, Derived)})
    return found


def check_derived(config: ml_collections.ConfigDict) -> None:
    """Refuse, in one ConfigError line, a derived setting set to a value beyond its `at_most` setting."""
    for key, setting in derived_settings(config).items():
        if not (setting.explicit and setting.at_most):
            continue
        section, _, name = setting.at_most.partition(".")
        value, limit = setting.get(), config[section][name]
        if value > limit:
            raise ConfigError(
                f"{key}={value} is more than {setting.at_most}={limit} ({setting.reason}); set --config.{key} to "
                f"{limit} or less, or leave it out to have it derived from {', '.join(setting.inputs)}")
