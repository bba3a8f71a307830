"""Run one CLI (train.py, eval.py or `transformer-jax COMMAND`) on many command lines in one process (for
the catalogues tests/cli/test_bad_*_inputs.py).

    python tests/cli_rows.py train.py|eval.py|COMMAND|transformer-jax ROWS.json OUT.json

ROWS.json holds a list of argument lists; OUT.json receives, for each, {"returncode", "stdout", "stderr"}
as a separate run of the script would give them: the row goes to its command (eval.py's old forms through
cli/old_forms.py, as eval.py sends them), whose flags are defined anew when the command changes, and is parsed
through the command's own parse_flags and main; an exception escaping main is written as its traceback
(exit 1), as Python would. One process saves each row the start-up of Python and JAX.
"""

import contextlib
import importlib
import json
import os
import pathlib
import sys
import tempfile
import traceback
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's package, not an installed copy

from absl import flags  # noqa: E402

from transformer_jax.__main__ import COMMANDS, PROGRAM  # noqa: E402
from transformer_jax.cli.flag_parsing import parse_flags  # noqa: E402
from transformer_jax.cli.old_forms import eval_command  # noqa: E402

BASELINE = set(flags.FLAGS)  # absl's own flags (and the libraries'), kept from command to command


def load(name: str):
    """The module of command `name`, its flags (and no other command's) defined."""
    for flag in set(flags.FLAGS) - BASELINE:
        delattr(flags.FLAGS, flag)
    module_name = COMMANDS[name].module
    sys.modules.pop(module_name, None)
    return importlib.import_module(module_name)


@contextlib.contextmanager
def captured() -> Iterator[dict]:
    """Capture what this process writes to stdout and stderr, at the file-descriptor level (SentencePiece and
    absl logging write there too)."""
    output: dict = {}
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    files = {fd: tempfile.TemporaryFile(mode="w+b") for fd in (1, 2)}
    sys.stdout.flush(), sys.stderr.flush()
    for fd, file in files.items():
        os.dup2(file.fileno(), fd)
    try:
        yield output
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, file in files.items():
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
            file.seek(0)
            output["stdout" if fd == 1 else "stderr"] = file.read().decode(errors="replace")
            file.close()


def run_row(script: str, args: list[str], loaded: dict) -> dict:
    returncode = 0
    with captured() as output:
        try:
            if script == "eval.py":
                name, argv = eval_command([script, *args])
            elif script == PROGRAM:  # the row names its command: ["score", "--workdir=...", ...]
                name, argv = args[0], [script, *args[1:]]
            else:
                name, argv = "train" if script == "train.py" else script, [script, *args]
            if loaded.get("name") != name:
                loaded.update(name=name, module=load(name))
            for flag in [flag for flag in flags.FLAGS if flag.startswith("config.")]:
                delattr(flags.FLAGS, flag)  # the last row's --config.KEY overrides, defined by parsing it
            flags.FLAGS.unparse_flags()
            sys.argv = [f"{PROGRAM} {name}", *argv[1:]]  # where ml_collections looks for the --config.KEY overrides
            loaded["module"].main(parse_flags(sys.argv, module=loaded["module"]))
        except SystemExit as exit_:
            returncode = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - written out as Python itself would
            traceback.print_exc()
            returncode = 1
    return {"returncode": returncode, **output}


def main() -> None:
    script, rows, out = sys.argv[1:4]
    loaded: dict = {}
    results = [run_row(script, args, loaded) for args in json.loads(pathlib.Path(rows).read_text())]
    pathlib.Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
