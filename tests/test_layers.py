"""The package's floors go one way: a folder imports only folders below it, and no two folders import each other."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer_jax"
# Lowest first. `errors.py` is the root of user errors; the top-level __init__ re-exports the modules.
# `cli` (flags, one-line errors, the run lock) serves the entry points: train.py, eval.py and `aot`'s __main__.
FLOORS = ("errors", "base", "model", "decoding", "data", "config", "checkpoints", "training", "run", "evaluation",
          "export", "cli", "aot")


def imported_floors(path: pathlib.Path) -> set[str]:
    """The package folders (or top-level modules) that `path` imports from, at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transformer_jax."):
            names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.module == "transformer_jax":
            names = [f"transformer_jax.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("transformer_jax.")]
        found |= {name.split(".")[1] for name in names}
    return found


def test_every_folder_imports_only_folders_below_it():
    floors = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert floors | {"errors"} == set(FLOORS), "a new folder needs its place in FLOORS"
    upward = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 1:
            continue  # the top-level __init__ and errors.py
        floor = parts[0]
        for other in imported_floors(path) - {floor}:
            if FLOORS.index(other) > FLOORS.index(floor):
                upward.append(f"{path.relative_to(PACKAGE)} imports {other}")
    assert not upward, "imports that climb a floor: " + "; ".join(sorted(upward))


def test_only_the_checkpoints_folder_imports_orbax():
    importers = {path.relative_to(PACKAGE).parts[0] for path in PACKAGE.rglob("*.py")
                 if any(isinstance(node, (ast.Import, ast.ImportFrom)) and "orbax" in ast.unparse(node)
                        for node in ast.walk(ast.parse(path.read_text())))}
    assert importers == {"checkpoints"}
