"""The package's edges: the tools built on it (train.py, eval.py, configs/, benchmarks/ and the commands) import only
what a subpackage's `__init__` exports, and nothing in the package imports relatively (which the floors' test,
reading absolute imports, would not see).

Beside test_layers.py (the floors inside the package): this is the boundary from outside it. A deep import
(`from transformer_jax.aot.compile import ...`) ties a tool to a file's place; a name a subpackage does not
export, or a private one, to its insides. Either can break with every other test green.
"""

import ast
import importlib
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_jax"
# The commands' own modules: each may import its own folder's helpers, and the rest of the package publicly.
ENTRY_MODULES = [PACKAGE / "__main__.py", *sorted((PACKAGE / "cli").glob("*.py")), PACKAGE / "aot" / "__main__.py",
                 PACKAGE / "aot" / "preflight.py"]
TOOLS = [ROOT / "train.py", ROOT / "eval.py", *sorted((ROOT / "configs").glob("*.py")),
         *sorted((ROOT / "benchmarks").rglob("*.py"))]


# Calls that reach a module without importing it by name: the test's rule would not see what they open.
LOOKUPS = {"inspect.getmodule", "importlib.import_module", "sys.modules.get", "__import__"}
# The lookups a tool needs, with why: (file, the call) -> reason.
LOOKED_UP = {
    ("benchmarks/sections/loop.py", "inspect.getmodule(Trainer)"):
        "times the loop's module-level check_skip_streak by wrapping it where the loop calls it",
    ("transformer_jax/__main__.py", "importlib.import_module(COMMANDS[name].module)"):
        "the dispatcher imports only the chosen command's module (absl's flags are global)",
    ("benchmarks/run.py", "importlib.import_module(f'benchmarks.sections.{name}')"):
        "the harness imports the benchmark sections named on its command line",
}


def exported(module: str) -> set[str]:
    """What `module` (transformer_jax or one of its subpackages) exports: its __all__, and its subpackages."""
    package = importlib.import_module(module)
    names = set(getattr(package, "__all__", ()))
    if module == "transformer_jax":
        names |= {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    return names


def is_module(name: str) -> bool:
    """Whether `name` (transformer_jax.x.y) is a module or package of the checkout, not a name defined in one."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def own_folder(path: pathlib.Path) -> str | None:
    """The package folder an entry module sits in (its helpers there are its own), else None."""
    parts = path.relative_to(PACKAGE).parts if PACKAGE in path.parents else ()
    return f"transformer_jax.{parts[0]}" if len(parts) == 2 else None


def edge_problems(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Deep, unexported and private imports from the package in `path`, and private attributes of its modules (a
    class's private methods, which a benchmark may time by wrapping them, are not imports and not checked)."""
    problems, bound = [], set()
    own = own_folder(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("transformer_jax.") and alias.name.count(".") > 1:
                    problems.append(f"import {alias.name}")
                elif alias.name.startswith("transformer_jax"):
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "transformer_jax":
            if own and (node.module == own or node.module.startswith(own + ".")):
                continue
            if node.module.count(".") > 1:
                problems.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
                continue
            missing = [a.name for a in node.names if a.name.startswith("_") or a.name not in exported(node.module)]
            if missing:
                problems.append(f"from {node.module} import {', '.join(missing)} (not exported)")
            bound |= {a.asname or a.name for a in node.names if is_module(f"{node.module}.{a.name}")}
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in bound):
            problems.append(f"{node.value.id}.{node.attr} (private)")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in LOOKUPS:
            problems.append(f"{ast.unparse(node)} (a module looked up by value)")
    return [f"{path.relative_to(root)}: {problem}" for problem in problems
            if (str(path.relative_to(root)), problem.split(" (")[0]) not in LOOKED_UP]


def test_tools_and_commands_import_only_what_the_subpackages_export():
    problems = [problem for path in TOOLS + ENTRY_MODULES for problem in edge_problems(path)]
    assert not problems, f"{len(problems)} imports past the public API:\n" + "\n".join(problems)


def test_nothing_in_the_package_or_its_tools_imports_relatively():
    relative = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in [*PACKAGE.rglob("*.py"), *TOOLS]
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert not relative, "relative imports (the floors' test reads absolute ones only): " + ", ".join(relative)


def test_the_check_finds_a_deep_a_private_an_unexported_import_and_a_lookup(tmp_path):
    tool = tmp_path / "tool.py"
    tool.write_text("from transformer_jax.aot.compile import program_of\nfrom transformer_jax.run import _x\n"
                    "from transformer_jax.data import tokenizer\nfrom transformer_jax.base import workdir\n"
                    "workdir._private\nfrom transformer_jax.model import PAD_ID\n"
                    "import inspect\ninspect.getmodule(PAD_ID)\n")
    problems = [problem.split(": ", 1)[1] for problem in edge_problems(tool, tmp_path)]
    assert problems == ["from transformer_jax.aot.compile import program_of",
                        "from transformer_jax.run import _x (not exported)",
                        "from transformer_jax.data import tokenizer (not exported)",
                        "workdir._private (private)",
                        "inspect.getmodule(PAD_ID) (a module looked up by value)"]


def test_every_allowed_lookup_is_still_made():
    made = {(str(path.relative_to(ROOT)), ast.unparse(node)) for path in TOOLS + ENTRY_MODULES
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and ast.unparse(node.func) in LOOKUPS}
    assert set(LOOKED_UP) <= made, f"LOOKED_UP entries no tool makes any more: {set(LOOKED_UP) - made}"
