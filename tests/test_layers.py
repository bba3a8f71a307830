"""The package's floors go one way: a folder imports only folders below it, and no two folders import each other."""

import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer_jax"
# Lowest first. `errors.py` is the root of user errors, `early_signals.py` keeps a command's stop signals from its
# first instruction (standard library only); the top-level __init__ re-exports the modules.
# `run` (the training loop and its parts) stands above what translates (decoding, evaluation, export): inference
# does not carry the trainer. `cli` (flags, one-line errors) serves the entry points: train.py, eval.py and `aot`'s
# __main__.
FLOORS = ("errors", "early_signals", "base", "model", "decoding", "data", "config", "checkpoints", "training", "evaluation", "export",
          "run", "cli", "aot")


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
    assert floors | {"errors", "early_signals"} == set(FLOORS), "a new folder needs its place in FLOORS"
    upward = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 1:
            continue  # the top-level __init__, errors.py and early_signals.py
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


def test_what_translates_stands_below_the_training_run():
    """decoding/, evaluation/ and export/ importing run/ climbs a floor (the test above then fails)."""
    assert all(FLOORS.index(floor) < FLOORS.index("run") for floor in ("decoding", "evaluation", "export"))


def loaded_modules(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code` (from the checkout: it imports this package)."""
    done = subprocess.run([sys.executable, "-c", f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_importing_the_translation_api_loads_no_training_loop_nor_log_writer():
    loaded = loaded_modules("from transformer_jax.evaluation import Translator")
    assert "transformer_jax.evaluation.translator" in loaded
    trainer = [name for name in loaded if name == "transformer_jax.run" or name.startswith("transformer_jax.run.")]
    assert not trainer, f"importing Translator loads the training run: {trainer}"
    writers = [name for name in loaded if name.split(".")[0] in ("tensorboardX", "wandb")]
    assert not writers, f"importing Translator loads the training logs' writers: {writers}"
    # Orbax's package __init__ imports all of it, its CheckpointManager and async checkpointer included, so a
    # restore cannot load less than `import orbax.checkpoint`; nothing beyond that is loaded.
    orbax = {name for name in loaded if name.split(".")[0] == "orbax"}
    beyond = orbax - {name for name in loaded_modules("import orbax.checkpoint") if name.split(".")[0] == "orbax"}
    assert orbax and not beyond, f"Orbax modules beyond its package import: {sorted(beyond)}"
