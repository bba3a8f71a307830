"""eval.py's flags of old, as the `transformer-jax` command they stand for (eval.py in a checkout keeps them).

  --translate=FILE                  translate --input=FILE
  --write_averaged=PATH             average --output=PATH   (with --checkpoint=latest unless given, as before)
  --export=FORMAT:DIR               export --format=FORMAT --output=DIR
  --plot_attention=TEXT, --plot_attention_target=TEXT, --plot_positional_encoding, --plot_curves
                                    plot --attention=TEXT --attention_target=TEXT --positional_encoding --curves
  none of them                      score (the same flags)
"""

from __future__ import annotations

import shlex
import sys
from typing import NoReturn

# eval.py's flag -> (its command, the command's flag); a flag with a value, or a boolean (`BOOLEANS`).
OLD_FLAGS = {
    "translate": ("translate", "input"),
    "write_averaged": ("average", "output"),
    "export": ("export", None),  # FORMAT:DIR -> --format, --output
    "plot_attention": ("plot", "attention"),
    "plot_attention_target": ("plot", "attention_target"),
    "plot_positional_encoding": ("plot", "positional_encoding"),
    "plot_curves": ("plot", "curves"),
}
BOOLEANS = ("plot_positional_encoding", "plot_curves")
# eval.py's flags that a command does not use (eval.py took and ignored them there): dropped, and named in the note.
_DECODING = ("mode", "beam_size", "alpha", "max_extra_length", "seed", "temperature", "top_k", "top_p", "dtype",
             "batch_size", "batch_tokens", "cpu_devices")
IGNORED = {"average": _DECODING, "export": _DECODING, "plot": ("batch_size", "batch_tokens", "cpu_devices")}
USER_ERROR_EXIT = 2
PROGRAM = "transformer-jax"  # as transformer_jax.__main__.PROGRAM: cli sits below the entry point


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT)


def _boolean(arg: str, name: str, value: str) -> bool:
    """The value of a boolean flag of old written `--name=value`, as absl reads it (true/t/1, false/f/0, any case);
    any other value (yes, no, an empty one) is refused in one line, as absl refuses it."""
    from absl.flags import BooleanParser

    try:
        return bool(BooleanParser().parse(value))
    except ValueError:
        _refuse(f"{arg}: {value!r} is not a boolean; pass --{name} (or --{name}=true) to draw it, --no{name} (or "
                f"--{name}=false) not to")


def _old_flags(argv: list[str]) -> tuple[dict[str, tuple[list[str], str | None]], list[str]]:
    """The old flags of argv[1:] ({name: (its arguments as written, value)}; a boolean's value None, a false one
    left out) and the other arguments, in order."""
    found, rest, index = {}, [], 1
    while index < len(argv):
        arg = argv[index]
        name, equals, value = arg.removeprefix("--").partition("=")
        negated = name.startswith("no") and name[2:] in BOOLEANS
        if not arg.startswith("--") or (name not in OLD_FLAGS and not negated):
            rest.append(arg)
        elif name in BOOLEANS or negated:
            flag = name.removeprefix("no") if negated else name
            found.pop(flag, None)
            if negated and equals:
                _refuse(f"{arg}: --{name} takes no value; pass --{name} (or --{flag}=false) not to draw it, "
                        f"--{flag} to draw it")
            if not negated and (not equals or _boolean(arg, flag, value)):
                found[name] = ([arg], None)
        elif equals:
            found[name] = ([arg], value)
        elif index + 1 < len(argv):  # --translate FILE
            index += 1
            found[name] = ([arg, argv[index]], argv[index])
        else:
            _refuse(f"{arg} needs a value; pass what it names (see --help)")
        index += 1
    return found, rest


def eval_command(argv: list[str]) -> tuple[str, list[str]]:
    """The command and flags that eval.py's `argv` stands for; a changed form is named in one line on stderr,
    and two commands in one line (or an empty value) are one error line, as eval.py gave them."""
    found, rest = _old_flags(argv)
    found = {name: found[name] for name in OLD_FLAGS if name in found}  # named in eval.py's order, as it did
    commands = list(dict.fromkeys(OLD_FLAGS[name][0] for name in found))
    if not commands:
        return "score", [argv[0], *rest]  # a false --plot_* left out
    if len(commands) > 1:
        first, second = (next(name for name in found if OLD_FLAGS[name][0] == command) for command in commands[:2])
        _refuse(f"--{first} and --{second} are two commands; run them one at a time")
    if any(arg == "--split" or arg.startswith("--split=") for arg in rest):
        _refuse(f"--split chooses the split to score, which --{next(iter(found))} does not do; drop --split, or "
                "score the split in a command of its own")
    new = []
    for name, (_, value) in found.items():
        if value is not None and not value.strip():
            _refuse(f"--{name} is empty; pass what it names (see --help)")
        if name == "export":
            fmt, colon, directory = value.partition(":")
            if not colon or not directory:
                _refuse(f"--export={value} is not FORMAT:DIR; e.g. --export=ctranslate2:model_ct2")
            new += [f"--format={fmt}", f"--output={directory}"]
        else:
            new_name = OLD_FLAGS[name][1]
            new.append(f"--{new_name}" if value is None else f"--{new_name}={value}")
    if commands[0] == "average" and not any(arg.split("=")[0] == "--checkpoint" for arg in rest):
        new.append("--checkpoint=latest")  # eval.py's default; `average` defaults to the run's eval.average_last
    rest, dropped = _without(rest, IGNORED.get(commands[0], ()))
    old = shlex.join(arg for written, _ in found.values() for arg in written)
    unused = f" ({', '.join(dropped)}: not used by {commands[0]}, dropped)" if dropped else ""
    # The whole command, quoted for a POSIX shell: pasted as shown, it runs just this.
    command = shlex.join([PROGRAM, commands[0], *new, *rest])
    print(f"note: eval.py {old} is `{command}` now{unused}; eval.py's form keeps working", file=sys.stderr)
    return commands[0], [argv[0], *new, *rest]


def _without(args: list[str], names: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """`args` without the flags `names` (--name=VALUE or --name VALUE), and the flags dropped as written."""
    kept, dropped, index = [], [], 0
    while index < len(args):
        name, equals, _ = args[index].removeprefix("--").partition("=")
        if args[index].startswith("--") and name in names:
            take = 1 if equals or index + 1 == len(args) else 2
            dropped.append(shlex.join(args[index:index + take]))
            index += take
            continue
        kept.append(args[index])
        index += 1
    return kept, dropped
