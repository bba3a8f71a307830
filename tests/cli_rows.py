"""Run one CLI (train.py or eval.py) on many command lines in one process (for tests/run/test_bad_inputs.py).

    python tests/cli_rows.py train.py ROWS.json OUT.json

ROWS.json holds a list of argument lists; OUT.json receives, for each, {"returncode", "stdout", "stderr"}
as a separate run of the script would give them: the flags are parsed anew for each row through the
CLI's own parse_flags and main, and an exception escaping main is written as its traceback (exit 1),
as Python would. One process saves each row the start-up of Python and JAX.
"""

import contextlib
import importlib.util
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

from transformer_jax.cli.commands import parse_flags  # noqa: E402


def load(script: str):
    spec = importlib.util.spec_from_file_location(pathlib.Path(script).stem + "_cli", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def run_row(module, script: str, args: list[str]) -> dict:
    returncode = 0
    for name in [name for name in flags.FLAGS if name.startswith("config.")]:
        delattr(flags.FLAGS, name)  # the last row's --config.KEY overrides, defined by parsing it
    flags.FLAGS.unparse_flags()
    sys.argv = [script, *args]  # where ml_collections looks for the --config.KEY overrides
    with captured() as output:
        try:
            module.main(parse_flags(sys.argv))
        except SystemExit as exit_:
            returncode = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - written out as Python itself would
            traceback.print_exc()
            returncode = 1
    return {"returncode": returncode, **output}


def main() -> None:
    script, rows, out = sys.argv[1:4]
    module = load(script)
    results = [run_row(module, script, args) for args in json.loads(pathlib.Path(rows).read_text())]
    pathlib.Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
