"""The README's and docs/ pages' code examples run, and every flag, key, file and make target they name exists."""

import json
import pathlib
import re
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE_MAP = ROOT / "docs" / "package.md"


def doc_pages() -> Iterator[tuple[pathlib.Path, str]]:
    """(path, text) of README.md and of every docs/*.md page."""
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        yield path, path.read_text(encoding="utf-8")


def all_docs_text() -> str:
    return "\n".join(text for _, text in doc_pages())


def test_the_docs_pages_exist_and_link_back_to_the_readme():
    pages = [path for path, _ in doc_pages() if path != README]
    names = {path.name for path in pages}
    assert {"training.md", "scaling.md", "evaluation.md", "modules.md", "configuration.md",
            "package.md", "guarantees.md"} <= names
    readme = README.read_text(encoding="utf-8")
    for path in pages:
        assert f"(docs/{path.name}" in readme, f"README does not link to docs/{path.name}"
        assert "](../README.md)" in path.read_text(encoding="utf-8").split("\n## ", 1)[0], (
            f"docs/{path.name} does not link back to the README before its first section")


def marked_block(marker: str, language: str = "python") -> tuple[pathlib.Path, str]:
    """The ```language block that follows `<!-- marker -->`, in whichever page holds the marker."""
    found = [(path, match.group(1)) for path, text in doc_pages()
             for match in re.finditer(rf"<!-- {marker} -->\s*```{language}\n(.*?)```", text, re.S)]
    assert len(found) == 1, f"expected one {language} block after <!-- {marker} -->, found {len(found)}"
    return found[0]


def run_marked_block(marker: str) -> dict:
    path, source = marked_block(marker)
    namespace: dict = {}
    exec(compile(source, f"{path.relative_to(ROOT)}:{marker}", "exec"), namespace)
    return namespace


def test_reuse_example_is_in_the_readme():
    path, _ = marked_block("reuse-example")
    assert path == README


def test_reuse_example_trains_a_classifier_on_the_encoder():
    losses = run_marked_block("reuse-example")["losses"]
    assert len(losses) == 20
    assert losses[-1] < 0.5 * losses[0]


def test_nnx_example_wraps_the_modules_and_steps_like_linen():
    import jax
    import numpy as np
    import optax

    namespace = run_marked_block("nnx-example")
    before, after = namespace["before"], namespace["after"]
    # The NNX step is the linen step: the same gradients and Adam update from the same weights.
    linen_model, loss_of, src, tgt_in = (namespace[k] for k in ("linen_model", "loss_of", "src", "tgt_in"))
    optimizer = optax.adam(1e-3)

    @jax.jit
    def linen_step(params):
        grads = jax.grad(lambda p: loss_of(linen_model.apply({"params": p}, src, tgt_in)))(params)
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
        return optax.apply_updates(params, updates)

    stepped = linen_step(before)
    assert jax.tree.structure(after) == jax.tree.structure(stepped)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
                zip(jax.tree.leaves(after), jax.tree.leaves(before)))
    assert moved > 5e-4  # the step changed the weights (Adam's first step is about the learning rate)
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(stepped)):
        np.testing.assert_allclose(a, b, atol=2e-5)  # Adam's first step is ~lr * sign(g): small g round apart
    assert float(loss_of(namespace["nnx_logits"])) < float(namespace["loss_before"])


def bash_blocks(text: str) -> list[str]:
    """A page's ```bash blocks, with backslash-continued lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [block.replace("\\\n", " ") for block in blocks]


def module_flags(module: str) -> set[str]:
    """The absl flags a command's module defines (DEFINE_*("name", ...), DEFINE_config_file("name", ...)), with
    the shared ones it defines by calling cli/run_flags.py's or cli/cluster.py's functions."""
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    cli = ROOT / "transformer_jax" / "cli"
    if "define_run_flags(" in source or "define_search_flags(" in source:
        source += (cli / "run_flags.py").read_text()
    if "define_cluster_flags()" in source or "define_run_flags()" in source:
        source += (cli / "cluster.py").read_text()
    names = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
    assert names, f"{module} defines no flags?"
    return names | {"help", "helpfull", "verbosity"}  # absl's own flags


def command_flags() -> dict[str, set[str]]:
    """The flags of each `transformer-jax` command, and of train.py and eval.py (eval.py: its five commands' and its
    own flags of old)."""
    from transformer_jax.__main__ import COMMANDS
    from transformer_jax.cli.old_forms import OLD_FLAGS

    known = {name: module_flags(command.module) for name, command in COMMANDS.items()}
    known["train.py"] = known["train"]
    known["eval.py"] = set(OLD_FLAGS).union(*(known[name] for name in ("score", "translate", "average", "export",
                                                                        "plot")))
    return known


def test_every_command_flag_in_the_docs_exists():
    commands = []  # (page, command line)
    for path, text in doc_pages():
        commands += [(path.name, line) for block in bash_blocks(text) for line in block.splitlines()]
        commands += [(path.name, line) for line in re.findall(r"`((?:python )?(?:train|eval)\.py [^`]*)`", text)]
        commands += [(path.name, line) for line in re.findall(r"`(transformer-jax \w+ [^`]*)`", text)]
    known = command_flags()
    checked = 0
    for page, command in commands:
        for name, defined in known.items():
            script = name if name.endswith(".py") else f"transformer-jax {name}"
            if f"{script} " not in command:
                continue
            used = set(re.findall(r"(?<![\w-])--(\w+)", command.split(f"{script} ", 1)[1]))
            assert used <= defined, f"{page} uses {sorted(used - defined)} with {script}: {command.strip()}"
            checked += 1
    assert checked >= 15
    # Flags named in prose belong to a command, or to the other tools the docs run.
    others = {"file_format", "data_dir", "zone", "worker", "command", "update", "logdir",
              "nodes", "ntasks", "gpus", "requeue",  # srun, sbatch
              "accelerator", "version", "spot",  # gcloud compute tpus tpu-vm create
              "xla_force_host_platform_device_count", "xla_gpu_deterministic_ops",
              "xla_gpu_enable_command_buffer"}  # XLA_FLAGS
    others |= {"local", "max"}  # hf download --local-dir; fairseq-train --max-tokens
    others |= {"server", "member", "role"}  # kubectl apply --server-side; gcloud storage buckets add-iam-policy-binding
    others |= {"build", "cluster", "project", "workload", "tpu", "device", "num", "docker", "termination"}  # docker
    # build --build-arg; xpk workload create --tpu-type, --device-type, --num-slices, --docker-image, --max-restarts, ...
    # python -m benchmarks.run: its argparse options.
    bench = set(re.findall(r"add_argument\(\s*\"--(\w+)\"", (ROOT / "benchmarks" / "run.py").read_text()))
    assert "sections" in bench
    known_anywhere = set().union(*known.values()) | bench | others | {"config_help"}
    for path, text in doc_pages():
        named = set(re.findall(r"(?<![\w-])--(\w+)", text))
        assert named - known_anywhere == set(), f"{path.name} names flags that no command defines: " \
            f"{sorted(named - known_anywhere)}"


# Keys the docs name as examples of a key that is not a setting (what the command line says about one).
UNKNOWN_EXAMPLES = {"training.warmup"}


def test_every_config_key_in_the_docs_exists():
    from transformer_jax.config.schema import default_config

    config = default_config()
    keys: dict[str, str] = {}  # key -> the page naming it
    for path, text in doc_pages():
        found = set(re.findall(r"--config\.([\w.]+?)(?==|\s|`|$)", text, re.M))
        # Keys named in prose, e.g. `training.keep_checkpoints` or `data.pack=False` (not `eval.py`).
        found |= set(re.findall(r"`((?:model|data|training|mesh|eval)\.(?!py`)\w+)(?:=[^`]*)?`", text))
        keys.update({key: path.name for key in found})
    assert len(keys) >= 15
    for key, page in sorted(keys.items()):
        if key == "KEY":
            continue
        section, _, name = key.partition(".")
        if key in UNKNOWN_EXAMPLES:  # the docs' example of a mistyped key: it must stay one
            assert name not in config[section], f"{page}'s example of an unknown key, --config.{key}, is a setting"
            continue
        assert section in config and name in config[section], f"{page} names --config.{key}, which does not exist"


def package_map_rows() -> list[str]:
    """docs/package.md's module rows: `| \\`model/attention.py\\` | ... |`, paths relative to transformer_jax/."""
    rows = [line for line in PACKAGE_MAP.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    assert rows, "docs/package.md has no module rows"
    return rows


def package_map_modules() -> set[str]:
    """The modules the package map's rows name in their first cell."""
    return {path for row in package_map_rows() for path in re.findall(r"`([\w/]+\.py)`", row.split(" | ")[0])}


def test_every_repository_file_the_docs_name_exists():
    missing = []
    count = 0
    top_level = ("train.py", "eval.py", "Makefile", "BENCHMARKS.md", "pyproject.toml")
    for path, text in doc_pages():
        paths = set(re.findall(r"(?<![\w/<.])((?:transformer_jax|configs|tests|benchmarks)/[\w/]+\.\w+)", text))
        paths |= {name for name in top_level if name in text}
        count += len(paths)
        missing += [f"{path.name}: {name}" for name in sorted(paths) if not (ROOT / name).exists()]
    # The package map names files relative to the package: `model/attention.py`, `errors.py`.
    modules = {f"transformer_jax/{module}" for module in package_map_modules()}
    count += len(modules)
    missing += [f"package.md: {name}" for name in sorted(modules) if not (ROOT / name).exists()]
    assert count >= 50
    assert not missing, f"the docs name files that do not exist: {missing}"


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def broken_links(path: pathlib.Path) -> list[str]:
    """The relative links of page `path` (outside code blocks) to a file or heading that does not exist."""
    broken = []
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target:
            continue
        linked = (path.parent / target) if target else path
        if not linked.exists():
            broken.append(f"{path.name}: {target}")
        elif anchor and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{path.name}: {target}#{anchor}")
    return broken


def test_every_relative_link_in_the_docs_leads_to_a_file_and_heading():
    broken = [link for path, _ in doc_pages() for link in broken_links(path)]
    assert not broken, f"links to files or headings that do not exist: {broken}"


def test_the_package_map_names_every_module():
    modules = sorted(path.relative_to(ROOT / "transformer_jax").as_posix()
                     for path in (ROOT / "transformer_jax").rglob("*.py"))
    listed = package_map_modules()
    missing = [module for module in modules if not module.endswith("__init__.py") and module not in listed]
    assert not missing, f"docs/package.md's package map does not list {missing}"


def test_make_targets_in_the_docs_exist():
    readme_targets = set(re.findall(r"^make (\w+)", "\n".join(bash_blocks(README.read_text(encoding="utf-8"))), re.M))
    assert readme_targets == {"demo", "test"}
    makefile = (ROOT / "Makefile").read_text()
    for path, text in doc_pages():
        targets = set(re.findall(r"^make (\w+)", "\n".join(bash_blocks(text)), re.M))
        targets |= set(re.findall(r"`make (\w+)`", text))
        for target in targets:
            assert re.search(rf"^{target}:", makefile, re.M), f"{path.name} runs make {target}; the Makefile has no such target"


# The recipes' trainings below, capped at a few steps of 256-token batches (a step of 1,024 tokens took ~0.4 s on 2
# cores with the suite's quicker compiles), one layer per stack (the tier's two layers cost each training ~15 s more
# CPU on 2 cores, most of it compiling), no dev evaluation during training (compiling and running the dev loss: ~1-2 s
# of CPU a training; no assertion reads it) and one checkpoint, at the last step (the tier saves one at every step of
# so short a run): the tests show the lines run, not BLEU. The tier's own sizes are checked in
# tests/config/test_parallel_text.py.
CAPPED_TRAINING = ("--config.training.num_train_steps=6", "--config.training.warmup_steps=3",
                   "--config.data.tokens_per_batch=256", "--config.model.num_layers=1",
                   "--config.training.eval_every=0", "--config.training.checkpoint_every=6")


def test_the_own_text_lines_train_and_evaluate_on_files_as_written(tmp_path):
    """The README's "Train on your own text" lines, run as written (`transformer-jax` as this checkout's
    `python -m transformer_jax`), on a small corpus in fairseq's layout (train.*, valid.*, no test split), the training
    capped as the back-translation test below is (CAPPED_TRAINING): the run trains, its final
    scores are named dev, and `score` scores dev."""
    import subprocess
    import sys

    from runs import script_env
    from transformer_jax.data.builtin.corpus import generate_pairs

    lines = [line for line in marked_block("own-text", "bash")[1].splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("transformer-jax train ") and \
        lines[1].startswith("transformer-jax score ")
    corpus = tmp_path / "my_corpus"
    corpus.mkdir()
    pairs = generate_pairs(92, seed=5)
    for split, part in (("train", pairs[:80]), ("valid", pairs[80:])):
        for side, lang in enumerate(("en", "de")):
            (corpus / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in part), encoding="utf-8")
    # The tier's own sizes (its 4,096-token batches and 20 or more updates) took 80 of this test's 107 s (2 cores,
    # 2026-12-02); which tier and model the corpus gets is checked in config.json below, the sizing itself in
    # tests/config/test_parallel_text.py. PYTHONPATH: this checkout's package, whatever the virtualenv's editable
    # install points at.
    env = script_env(1, PYTHONPATH=str(ROOT))
    results = [subprocess.run([sys.executable, "-m", "transformer_jax", *line.split()[1:],
                               *(CAPPED_TRAINING if line.startswith("transformer-jax train ") else [])],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600) for line in lines]
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    assert "has no test.en and test.de: the test split is optional" in results[0].stderr
    assert re.search(r"^dev SacreBLEU \d+\.\d\d", results[0].stdout, re.M), results[0].stdout
    assert "SacreBLEU" in results[1].stdout and "dev" in results[1].stdout
    saved = json.loads((tmp_path / "runs" / "my_corpus" / "config.json").read_text())
    assert saved["data"]["source"] == "text" and saved["model"]["d_model"] == 128  # the smallest tier


def test_the_translator_example_translates_a_run_in_the_callers_order(trained_run, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "demo").symlink_to(trained_run["workdir"])  # the example's run, a trained tiny one
    monkeypatch.chdir(tmp_path)
    run_marked_block("translator-example")
    printed = [eval(line) for line in capsys.readouterr().out.splitlines()]  # two printed lists of strings
    assert [len(translations) for translations in printed] == [3, 1] and printed[0][1] == ""


def test_the_run_from_python_example_trains_the_smoke_run(tmp_path, monkeypatch, capfd):
    """docs/modules.md's two calls (assemble_run, Trainer) train the packaged smoke config to its last step. (Output
    captured at the file descriptors: SentencePiece's trainer writes to them.)"""
    from transformer_jax.configs import smoke

    monkeypatch.chdir(tmp_path)
    namespace = run_marked_block("run-from-python")
    steps = smoke.get_config().training.num_train_steps
    assert int(namespace["state"].step) == steps and capfd.readouterr().out.splitlines()[-1] == str(steps)
    assert (tmp_path / "runs" / "smoke_from_python" / "checkpoints" / str(steps)).is_dir()


def test_the_back_translation_recipe_runs_in_its_order(tmp_path):
    """docs/back_translation.md's lines on a tiny corpus (`transformer-jax` as this checkout's
    `python -m transformer_jax`, each training capped by CAPPED_TRAINING, with one vocabulary size and no test
    translation, below): each runs, and the union holds the real pairs and the tagged synthetic ones. No BLEU claim."""
    import subprocess
    import sys

    from runs import NO_TEST_TRANSLATION, script_env
    from transformer_jax.data.builtin.corpus import generate_pairs

    path, block = marked_block("back-translation", "bash")
    assert path.name == "back_translation.md"
    lines = [line for line in block.splitlines() if line.strip()]
    pairs = generate_pairs(180, seed=7)
    (tmp_path / "my_corpus").mkdir()
    for split, part in (("train", pairs[:120]), ("valid", pairs[120:140])):
        for side, lang in enumerate(("en", "de")):
            (tmp_path / "my_corpus" / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in part))
    (tmp_path / "mono.de").write_text("".join(target + "\n" for _, target in pairs[140:]))
    # Both models get one vocabulary size (the tier sizes each from its corpus: 899 and 1,034 pieces here, so 512 is
    # supported by both), so that the second training compiles nothing the first did not (about 4 s of CPU); and
    # each training ends at its last checkpoint (NO_TEST_TRANSLATION): no assertion reads its translation of dev.
    capped = [*CAPPED_TRAINING, "--config.data.vocab_size=512", NO_TEST_TRANSLATION]
    for line in lines:
        command = line.replace("transformer-jax ", f"{sys.executable} -m transformer_jax ")
        if " train " in command:
            command += " " + " ".join(capped)
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=script_env(), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
    union = (tmp_path / "union" / "train.en").read_text().splitlines()
    assert len(union) == 120 + 40 == len((tmp_path / "union" / "train.de").read_text().splitlines())
    assert all(line.startswith("<BT> ") for line in union[120:]) and not union[0].startswith("<BT>")
    assert "SacreBLEU" in done.stdout  # the last line scored the forward model


def test_the_user_compile_lane_lists_tests_that_exist_each_with_the_promise_it_backs():
    """tests/README.md's lane table is the lane (the Makefile's test-user reads its first column, as this does): each
    row names a test function that exists and links the page making the promise, and its links lead somewhere."""
    lane = ROOT / "tests" / "README.md"
    rows = re.findall(r"^\| `(tests/[^`]*)` \|(.*)$", lane.read_text(encoding="utf-8"), re.M)
    assert len(rows) >= 5
    for test_id, rest in rows:
        path, _, name = test_id.partition("::")
        assert (ROOT / path).is_file() and re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), test_id
        promise = rest.split(" | ")[0]
        assert "](../" in promise or "the lane itself" in promise, f"{test_id} names no page: {promise}"
    assert not broken_links(lane), broken_links(lane)
