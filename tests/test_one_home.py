"""One home, kept: a run directory's names come only from base/workdir.py, the special token ids only from
model/special_tokens.py, and no code spells the padding id as a literal 0 (the package, the CLIs, configs and
benchmarks alike)."""

import ast
import pathlib

from transformer_jax.base import workdir as layout

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYOUT_HOME = "transformer_jax/base/workdir.py"
SPECIAL_HOME = "transformer_jax/model/special_tokens.py"
SPECIAL_IDS = {"PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID"}
# Every file and folder name of a run directory: ENTRIES' keys and the module's other name constants.
LAYOUT_NAMES = set(layout.ENTRIES) | {
    value for name, value in vars(layout).items()
    if name.isupper() and isinstance(value, str) and value not in (layout.FILE, layout.DIRECTORY)}
# The same word as a layout name, meaning something else: (file, string) -> why.
SAME_WORD = {
    ("transformer_jax/export/hf_directory.py", "config.json"): "a Hugging Face model directory's file, not a run's",
    ("transformer_jax/cli/cluster.py", "compilation_cache"): "the --compilation_cache flag's name",
    ("transformer_jax/config/schema.py", "wandb"): "the wandb package's name (is it installed?)",
    ("benchmarks/lease/gpu_run.py", "eval"): "the benchmark's eval.py phase",
    ("benchmarks/lease/records.py", "eval"): "the lease run's eval.py phase",
    ("benchmarks/suite_cpu.py", "compilation_cache"): "a JAX monitoring event's name",
}
TOKEN_WORDS = ("ids", "tokens", "src", "tgt")  # in a name that holds token ids
TOKEN_KEYS = ("inputs", "targets")  # batch keys that hold token ids
PAD_KEYWORDS = ("padding_idx", "ignore_index", "pad_id", "pad_token_id")  # arguments that name the padding id


def checked_files() -> list[pathlib.Path]:
    """The package, the two CLIs, configs and benchmarks."""
    return sorted([*(ROOT / "transformer_jax").rglob("*.py"), ROOT / "train.py", ROOT / "eval.py",
                   *(ROOT / "configs").glob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


def parsed() -> list[tuple[str, ast.Module]]:
    """(path relative to the root, syntax tree) of every checked file."""
    return [(path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())) for path in checked_files()]


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of `tree`'s module, classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def keys(tree: ast.Module) -> set[int]:
    """The ids of string constants used as dict keys or subscripts (JSON and config keys, not paths)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found |= {id(key) for key in node.keys if key is not None}
        elif isinstance(node, ast.Subscript):
            found.add(id(node.slice))
    return found


def layout_name(text: str) -> str | None:
    """The layout name `text` is, or has as a path component; None for messages (anything with a space)."""
    if any(character.isspace() for character in text):
        return None
    return next((part for part in text.split("/") if part in LAYOUT_NAMES), None)


def test_run_directory_names_are_spelled_only_in_base_workdir():
    found, same_words = [], set()
    for path, tree in parsed():
        if path == LAYOUT_HOME:
            continue
        skip = docstrings(tree) | keys(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                name = layout_name(node.value)
                if name and (path, name) in SAME_WORD:
                    same_words.add((path, name))
                elif name:
                    found.append(f"{path}:{node.lineno} {node.value!r}")
    assert not found, "run-directory names spelled outside base/workdir.py (use its constants): " + "; ".join(found)
    assert same_words == set(SAME_WORD), f"SAME_WORD entries no file needs any more: {set(SAME_WORD) - same_words}"


def test_special_ids_are_defined_and_imported_from_their_home():
    found = []
    for path, tree in parsed():
        inside = path.startswith("transformer_jax/")
        homes = {"transformer_jax.model.special_tokens"} if inside else {"transformer_jax.model", "transformer_jax"}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and path != SPECIAL_HOME:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {target.id for target in targets if isinstance(target, ast.Name)}
                found += [f"{path}:{node.lineno} assigns {name}" for name in sorted(names & SPECIAL_IDS)]
            elif isinstance(node, ast.ImportFrom) and node.module not in homes:
                names = {alias.name for alias in node.names} & SPECIAL_IDS
                found += [f"{path}:{node.lineno} imports {name} from {node.module}" for name in sorted(names)]
    assert not found, ("special ids defined or imported away from model/special_tokens.py (from outside the "
                       "package: transformer_jax.model): " + "; ".join(found))


def holds_tokens(node: ast.expr) -> bool:
    """Whether `node` reads as token ids: a name with ids/tokens/src/tgt in it, or a subscript of one or of a
    batch (`batch["inputs"]`, `batch[name]`)."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        return (holds_tokens(node.value) or "batch" in ast.unparse(node.value)
                or (isinstance(key, ast.Constant) and key.value in TOKEN_KEYS))
    if isinstance(node, (ast.Name, ast.Attribute)):
        word = node.id if isinstance(node, ast.Name) else node.attr
        return any(part in TOKEN_WORDS for part in word.lower().split("_"))
    return False


def is_zero(node: ast.expr | None) -> bool:
    """Whether `node` is the literal 0."""
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == 0


def zero_fill(call: ast.Call) -> bool:
    """`full(shape, 0, ...)`, `full_like(x, 0)`, `pad(..., constant_values=0)` or `fill_value=0`."""
    function = ast.unparse(call.func).rsplit(".", 1)[-1]
    keywords = {keyword.arg: keyword.value for keyword in call.keywords}
    return (any(is_zero(keywords.get(arg)) for arg in ("constant_values", "fill_value"))
            or (function in ("full", "full_like") and len(call.args) > 1 and is_zero(call.args[1])))


def literal_padding(tree: ast.Module) -> list[ast.AST]:
    """`tokens != 0`, `src == 0`, `pad(tokens, ..., constant_values=0)`, `ids = full(shape, 0)`, `padding_idx=0`:
    0 as padding; and a `pad(...)` that does not say what it fills with (NumPy's and JAX's default, 0)."""
    found: dict[int, ast.AST] = {}  # by id: a pad call assigned to a token name is met twice
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            left, right = node.left, node.comparators[0]
            if (holds_tokens(left) and is_zero(right)) or (holds_tokens(right) and is_zero(left)):
                found[id(node)] = node
        elif isinstance(node, ast.Call):
            pads = ast.unparse(node.func).rsplit(".", 1)[-1] == "pad"
            pads_tokens = pads and node.args and holds_tokens(node.args[0])
            unsaid = pads and "constant_values" not in {keyword.arg for keyword in node.keywords}
            if (pads_tokens and zero_fill(node)) or unsaid or any(
                    keyword.arg in PAD_KEYWORDS and is_zero(keyword.value) for keyword in node.keywords):
                found[id(node)] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(holds_tokens(target) for target in targets):
                found.update({id(call): call for call in ast.walk(node.value)
                              if isinstance(call, ast.Call) and zero_fill(call)})
    return list(found.values())


def test_padding_is_never_a_literal_zero():
    found = [f"{path}:{node.lineno} {ast.unparse(node)}" for path, tree in parsed() for node in literal_padding(tree)]
    assert not found, "padding spelled as 0 (use PAD_ID): " + "; ".join(found)
