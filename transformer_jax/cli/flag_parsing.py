"""The command line read: config files found (a packaged config named by `--config=NAME`), absl's flags parsed
with every mistake as one line and exit status 2, a command's --help, blank names refused, bare words named."""

from __future__ import annotations

import os
import re
import shlex
import sys
import traceback
import types
from typing import Any

from absl import flags

from transformer_jax.cli.user_errors import USER_ERROR_EXIT
from transformer_jax.errors import ConfigError, UserError


def _config_path(argv: list[str]) -> str | None:
    """The file named by the last --config on the command line (before any `:argument`), or None."""
    path = None
    for index, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1].split(":", 1)[0]
        elif arg == "--config" and index + 1 < len(argv):
            path = argv[index + 1].split(":", 1)[0]
    return path


def _config_file_failure(path: str | None, error: Exception) -> str:
    """One line saying where the config file's own code failed (a syntax error, a NameError, ...)."""
    if isinstance(error, SyntaxError):
        return f"config file {error.filename}:{error.lineno}: {error.msg}"
    frames = traceback.extract_tb(error.__traceback__)
    inside = [frame for frame in frames if path and os.path.abspath(frame.filename) == os.path.abspath(path)]
    where = f"{inside[-1].filename}:{inside[-1].lineno}" if inside else path
    detail = (str(error).splitlines() or [""])[0]
    return f"config file {where}: {type(error).__name__}: {detail}"


# The configs that ship with the package (the checkout's configs/, installed as transformer_jax.configs).
PACKAGED_CONFIGS = "transformer_jax.configs"
# The flags that print a command's help (its docstring and its flags) and exit 0.
HELP = ("--help", "-h", "-?", "--helpshort")


def packaged_config(value: str) -> str:
    """--config's value with a packaged config's name (`demo`, `parallel_text:DIR,SRC,TGT`; also `demo.py` or
    `configs/demo.py` where no such file is here) replaced by the installed file's path; else unchanged."""
    import importlib.resources

    path, colon, argument = value.partition(":")
    if os.path.exists(path) or not path or os.path.dirname(path) not in ("", "configs"):
        return value
    name = os.path.basename(path).removesuffix(".py")
    try:
        installed = importlib.resources.files(PACKAGED_CONFIGS) / f"{name}.py"
    except ModuleNotFoundError:
        return value
    return f"{installed}{colon}{argument}" if installed.is_file() else value


def packaged_config_names() -> list[str]:
    """The names of the packaged configs (`--config=NAME`)."""
    import importlib.resources

    try:
        files = importlib.resources.files(PACKAGED_CONFIGS).iterdir()
    except ModuleNotFoundError:
        return []
    return sorted(item.name.removesuffix(".py") for item in files if item.name.endswith(".py")
                  and not item.name.startswith("_"))


def _with_packaged_configs(argv: list[str]) -> list[str]:
    """argv with each --config value naming a packaged config replaced by its file (`packaged_config`)."""
    resolved = list(argv)
    for index, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            resolved[index] = "--config=" + packaged_config(arg.split("=", 1)[1])
        elif arg == "--config" and index + 1 < len(argv):
            resolved[index + 1] = packaged_config(argv[index + 1])
    return resolved


def command_help(module: types.ModuleType) -> str:
    """A command's --help: its module's docstring, then its flags (those it defines, and the shared ones it uses)."""
    listed = [line for line in flags.FLAGS.module_help(module.__name__).splitlines()
              if line.strip() and line.strip() != f"{module.__name__}:"]  # not absl's line naming the module
    if any(line.startswith("  --config:") for line in listed):
        listed.append(f"  {CONFIG_HELP}: list every run config key with its default and meaning")
    return "{}\n\nflags:\n{}\n".format((module.__doc__ or "").strip(), "\n".join(listed))


def refuse_blank(holder: flags.FlagHolder, needed: str) -> None:
    """Refuse a blank value of a name-giving flag (`--workdir=`, `--output=' '`) when the command line is parsed,
    before any work: "--NAME is empty; pass NEEDED", where a message quoting it would show '' (or a path of
    spaces would be made). A flag left out keeps its default or its required-flag line; a multi-string
    flag is blank when every value is."""
    def named(value: Any) -> bool:
        values = value if isinstance(value, list) else [value]
        if value is not None and not "".join(part for v in values for part in str(v).split(",")).strip():
            raise ConfigError(f"--{holder.name} is empty; pass {needed}")
        return True

    flags.register_validator(holder.name, named)


def register_key_flags(holders: list[flags.FlagHolder], depth: int = 2) -> None:
    """Make the flags key flags of the module `depth` frames up (the one that called the function defining them),
    so that the command's --help lists them."""
    module = sys._getframe(depth).f_globals["__name__"]  # noqa: SLF001 - absl's own way to name a calling module
    for holder in holders:
        flags.FLAGS.register_key_flag_for_module(module, flags.FLAGS[holder.name])


def unexpected_argument(word: str, module: types.ModuleType) -> str:
    """The line refusing a word on the command line that is no flag (every command takes flags alone), naming the
    flag of the command's `module` it was probably meant for: one it names (`split=dev`), one whose choices hold
    it (`dev`: --split), --config for a .py file, else the module's `BARE_WORD_FLAG` (translate: --input)."""
    own = {flag.name: flag for flag in flags.FLAGS.get_key_flags_for_module(module.__name__)}
    name, equals, _ = word.lstrip("-").partition("=")
    choices = [flag.name for flag in own.values() if word in (getattr(flag.parser, "enum_values", None) or ())]
    bare = getattr(module, "BARE_WORD_FLAG", None)
    if bare is not None and flags.FLAGS[bare.name].present and not isinstance(flags.FLAGS[bare.name], flags.MultiFlag):
        bare = None  # given already: the word is not its value
    if equals and name in own:
        meant = f"--{word.lstrip('-')}"
    elif choices:
        meant = f"--{choices[0]}={word}"
    elif word.endswith(".py") and "config" in own:
        meant = f"--config={word}"
    elif bare is not None:
        meant = f"--{bare.name}={word}"
    else:
        return f"unexpected argument {word!r}: this command takes flags only (see --help)"
    return f"unexpected argument {word!r}; pass it as {shlex.quote(meant)} (see --help)"


def parse_flags(argv: list[str], module: types.ModuleType | None = None) -> list[str]:
    """absl flag parsing where a bad flag, config file or --config override is one line and exit status 2;
    `--config_help` prints every run config key with its default and meaning (docs/configuration.md's source);
    with the command's `module`, --help prints its docstring and flags. A --config naming a packaged config
    (`--config=demo`) reads the installed file."""
    from absl import flags

    if CONFIG_HELP in argv[1:]:
        from transformer_jax.config import plain_text

        print(plain_text(), end="")
        sys.exit(0)
    if module is not None and any(arg in HELP for arg in argv[1:]):
        print(command_help(module), end="")
        sys.exit(0)
    argv = _with_packaged_configs(argv)

    path = _config_path(argv)
    if path == "":
        print(f"error: --config is empty; pass {_config_needed()}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    if path and not path.endswith(".json") and "://" not in path and not os.path.exists(path):
        named = os.path.dirname(path) in ("", "configs")  # a name, as a packaged config's would be
        shipped = (f", and no config of that name ships with the package; pass a config file's path, or one of "
                   f"{', '.join(packaged_config_names())}") if named else "; pass the path of a config file"
        print(f"error: --config={path}: no such file{shipped}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    if path and path.endswith(".json"):
        print(f"error: --config={path} is a JSON file, but a config is a Python file defining get_config() "
              f"(see configs/); to rerun a run's saved settings pass --config=configs/rerun.py:{path}",
              file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    from absl import logging as absl_logging

    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # ml_collections' own warnings would precede our one line
    try:
        remaining = flags.FLAGS(argv)
        if len(remaining) > 1:  # absl leaves the words that are no flag: no command takes any
            print(f"error: {unexpected_argument(remaining[1], module or sys.modules['__main__'])}", file=sys.stderr)
            sys.exit(USER_ERROR_EXIT)
        if "config" in flags.FLAGS:
            getattr(flags.FLAGS.config, "keys")  # a config file loads lazily: fail here, not mid-run
        return remaining
    except Exception as error:  # noqa: BLE001 - sorted below: the command line, or the config file's own code
        returned_none = re.search(r"--config must have a value other than None|NoneType>?\.\w+ does not exist",
                                  str(error).replace("'", ""))
        if path and returned_none:  # get_config() gave None: absl's and ml_collections' wording name no cause
            print(f"error: --config={path}: get_config() returned None (a missing return statement?); it must "
                  "return the run's settings: start from transformer_jax.config.default_config() (see configs/)",
                  file=sys.stderr)
            sys.exit(USER_ERROR_EXIT)
        # ml_collections re-raises a TypeError/ValueError of the config file as a new one holding the traceback,
        # which absl wraps again: the config file's own error is the innermost of the chain.
        if missing := _missing_flags(error):
            print(f"error: {missing}", file=sys.stderr)
            sys.exit(USER_ERROR_EXIT)
        original = _config_file_error(error, path) if "Error whilst parsing config file" in str(error) else error
        if isinstance(original, TypeError) and "get_config()" in str(original):
            detail = _get_config_arguments(path, original, argv)
        elif isinstance(original, UserError):
            detail = str(original).splitlines()[0]
        elif isinstance(original, SyntaxError) or _raised_in(original, path):
            detail = f"{_config_file_failure(path, original)}; a config is a Python file defining get_config()"
        elif "config" in flags.FLAGS and (override := _override_fault(argv, path)):
            detail = override
        elif isinstance(error, (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError)):
            # ml_collections writes "'key'\nDid you mean ..." and multi-line file errors: keep one line.
            lines = [line.strip() for line in str(error).replace("\\n", "\n").splitlines() if line.strip()]
            detail = " ".join(lines[-2:] if isinstance(error, OSError) else lines).replace("'", "").replace("\\", "")
            configs = " and configs/" if "config" in flags.FLAGS else ""
            detail = f"invalid command line: {detail}; see --help{configs}"
        else:
            raise
        print(f"error: {detail}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    finally:  # the level the command line set (--verbosity), else the one before parsing
        given = "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present
        absl_logging.set_verbosity(flags.FLAGS["verbosity"].value if given else verbosity)


# The flag that lists the run config's keys (parse_flags); named in --config's help.
CONFIG_HELP = "--config_help"


def _config_needed() -> str:
    """What --config takes, for the line refusing it missing or empty."""
    names = packaged_config_names()
    return "a config file, or the name of one that ships with the package" + (f" ({', '.join(names)})" if names else "")


def _missing_flags(error: Exception) -> str | None:
    """The line for required flags the command line lacks ("--config and --workdir are required"), else None."""
    missing = list(dict.fromkeys(re.findall(r"Flag (--\w+) must have a value other than None", str(error))))
    if not missing:
        return None
    if missing == ["--config"]:
        return f"--config is required: {_config_needed()}; see --help"
    names = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
    config = f" (--config: {_config_needed()})" if "--config" in missing else ""
    return f"{names} {'is' if len(missing) == 1 else 'are'} required{config}; see --help"


def _override_fault(argv: list[str], path: str | None) -> str | None:
    """The line for `--config.KEY` overrides without a --config, or for the first naming no run setting: "unknown
    key", with the nearest key (config.nearest_key); None when every override names one."""
    from transformer_jax.config import SETTINGS, nearest_key

    overrides = [arg for arg in argv[1:] if arg.startswith("--config.")]
    if overrides and path is None:
        return f"--config is required: the --config.KEY overrides change its settings; pass {_config_needed()}"
    keys = [setting.key for setting in SETTINGS]
    for arg in overrides:
        given, equals, value = arg.removeprefix("--config.").partition("=")
        if given in keys:
            continue
        setting = next((key for key in keys if given.startswith(f"{key}.")), None)
        if setting is not None:
            return (f"--config.{given}: {setting} is a setting, not a section of settings; pass "
                    f"--config.{setting}=VALUE ({CONFIG_HELP} lists every key)")
        nearest = nearest_key(given)
        hint = f" (did you mean --config.{nearest}{equals}{value}?)" if nearest else ""
        return f"unknown key --config.{given}{hint}; {CONFIG_HELP} lists every key"
    return None


def _config_file_error(error: BaseException, path: str | None) -> BaseException:
    """The error of the config file's own code in the chain that ended in `error` (following __cause__, then
    __context__): the outermost one raised in `path`, else the innermost."""
    chain, seen = [error], {id(error)}
    while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        chain.append(inner)
    return next((e for e in chain if _raised_in(e, path)), chain[-1])


def _get_config_arguments(path: str | None, error: TypeError, argv: list[str]) -> str:
    """The line for a --config=FILE[:ARGUMENT] whose argument get_config() does not take (or lacks)."""
    given = next((arg.split("=", 1)[1] for arg in reversed(argv) if arg.startswith("--config=")), path or "")
    if "missing" in str(error):
        return (f"--config={given}: get_config() of {path} needs an argument after a colon "
                f"(--config={path}:ARGUMENT; for configs/rerun.py the run's config.json: "
                f"--config=configs/rerun.py:RUN/config.json)")
    return f"--config={given}: get_config() of {path} takes no argument; drop the ':{given.partition(':')[2]}'"


def _raised_in(error: BaseException, path: str | None) -> bool:
    """Whether `error` was raised by code in file `path` (the config file), not by the flag parser."""
    return bool(path) and any(os.path.abspath(frame.filename) == os.path.abspath(path)
                              for frame in traceback.extract_tb(error.__traceback__))
