"""transformer-jax COMMAND [flags]: the installed command (also `python -m transformer_jax COMMAND`).

Each command is a module with its own flags (absl's flags are global, so only the chosen command's module is
imported) and a `main(argv)`; `transformer-jax COMMAND --help` lists its flags. train.py and eval.py in a
checkout are thin wrappers over the same commands.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import NoReturn

__all__ = ["COMMANDS", "main", "run_subcommand"]


@dataclasses.dataclass(frozen=True)
class Command:
    module: str  # the module defining the command's flags and main(argv)
    summary: str


COMMANDS = {
    "train": Command("transformer_jax.cli.train", "train a run (resuming it), then score its test split"),
    "prepare": Command("transformer_jax.cli.prepare", "prepare a config's corpus once, for a run on many hosts"),
    "preflight": Command("transformer_jax.aot.preflight", "compile a run for a TPU topology or GPUs: memory and "
                         "speed, before renting them"),
    "import": Command("transformer_jax.cli.import_marian", "import a Hugging Face Marian (OPUS-MT) model as a run"),
    "score": Command("transformer_jax.cli.score", "translate a split with a checkpoint and print SacreBLEU"),
    "translate": Command("transformer_jax.cli.translate", "translate a text file (or standard input) line by line"),
    "translate-corpus": Command("transformer_jax.cli.translate_corpus", "translate whole corpora resumably, over "
                                "every process (back-translation)"),
    "average": Command("transformer_jax.cli.average", "write the averaged parameters of the last checkpoints"),
    "export": Command("transformer_jax.cli.export", "write a checkpoint as a CTranslate2 or Hugging Face model"),
    "plot": Command("transformer_jax.cli.plot", "draw learning curves, positional encodings, attention maps"),
}
PROGRAM = "transformer-jax"
USER_ERROR_EXIT = 2  # as transformer_jax.cli.user_errors.USER_ERROR_EXIT, which this module does not import early


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return (f"usage: {PROGRAM} COMMAND [flags]   ({PROGRAM} COMMAND --help lists a command's flags)\n\ncommands:\n"
            + "\n".join(lines) + "\n")


def run_subcommand(name: str, argv: list[str] | None = None) -> NoReturn:
    """Run command `name` with the flags of `argv` (argv[0] is the program). SIGTERM/SIGINT recorded since the
    package's first line (transformer_jax/early_signals.py) are acted on when the command starts."""
    from transformer_jax.cli import early_signals, run_command

    early_signals()  # the command's imports take seconds: a stop meanwhile is acted on after
    argv = list(sys.argv if argv is None else argv)
    module = importlib.import_module(COMMANDS[name].module)  # defines the command's flags, and no other's
    run_command(module.main, [f"{PROGRAM} {name}", *argv[1:]], module=module)


def main(argv: list[str] | None = None) -> NoReturn:
    """The console script: `transformer-jax COMMAND [flags]`."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(usage(), end="", file=sys.stdout if len(argv) > 1 else sys.stderr)
        sys.exit(0 if len(argv) > 1 else USER_ERROR_EXIT)
    if argv[1] not in COMMANDS:
        print(f"error: {argv[1]!r} is not a {PROGRAM} command; choose one of {', '.join(COMMANDS)} "
              f"({PROGRAM} --help says what each does)", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    run_subcommand(argv[1], [argv[0], *argv[2:]])


if __name__ == "__main__":
    main()
