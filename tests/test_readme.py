"""The README's code examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_block(marker: str) -> str:
    """The ```python block that follows `<!-- marker -->` in the README."""
    match = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", README.read_text(), re.S)
    assert match, f"README has no python block after <!-- {marker} -->"
    return match.group(1)


def test_reuse_example_trains_a_classifier_on_the_encoder():
    namespace: dict = {}
    exec(compile(readme_block("reuse-example"), "README.md:reuse-example", "exec"), namespace)
    losses = namespace["losses"]
    assert len(losses) == 20
    assert losses[-1] < 0.5 * losses[0]


def test_nnx_example_wraps_the_modules_and_steps_like_linen():
    import jax
    import numpy as np
    import optax

    namespace: dict = {}
    exec(compile(readme_block("nnx-example"), "README.md:nnx-example", "exec"), namespace)
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


ROOT = README.parent


def bash_blocks() -> list[str]:
    """The README's ```bash blocks, with backslash-continued lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    return [block.replace("\\\n", " ") for block in blocks]


def script_flags(script: str) -> set[str]:
    """The absl flags a script defines (DEFINE_*("name", ...) and DEFINE_config_file("name", ...))."""
    source = (ROOT / script).read_text()
    names = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
    assert names, f"{script} defines no flags?"
    return names | {"help", "helpfull", "verbosity"}  # absl's own flags


def test_every_train_and_eval_flag_in_the_readme_exists():
    commands = [line for block in bash_blocks() for line in block.splitlines()]
    commands += re.findall(r"`((?:python )?(?:train|eval)\.py [^`]*)`", README.read_text())
    checked = 0
    for script in ("train.py", "eval.py"):
        defined = script_flags(script)
        for command in commands:
            if f"{script} " not in command:
                continue
            used = set(re.findall(r"(?<![\w-])--(\w+)", command.split(script, 1)[1]))
            assert used <= defined, f"README uses {sorted(used - defined)} with {script}: {command.strip()}"
            checked += 1
    assert checked >= 10
    # Flags named in prose belong to train.py or eval.py, or to the other tools the README runs.
    others = {"file_format", "data_dir", "zone", "worker", "command", "update", "logdir",
              "nodes", "ntasks", "gpus",  # srun
              "xla_force_host_platform_device_count", "xla_gpu_deterministic_ops"}  # XLA_FLAGS
    aot = script_flags("transformer_jax/aot/__main__.py")  # python -m transformer_jax.aot
    known = script_flags("train.py") | script_flags("eval.py") | aot | others
    named = set(re.findall(r"(?<![\w-])--(\w+)", README.read_text()))
    assert named - known == set(), f"README names flags that no script defines: {sorted(named - known)}"


def test_every_config_key_in_the_readme_exists():
    from transformer_jax.run.config_schema import default_config

    config = default_config()
    keys = set(re.findall(r"--config\.([\w.]+?)(?==|\s|`|$)", README.read_text(), re.M))
    # Keys named in prose, e.g. `training.keep_checkpoints` or `data.pack=False` (not `eval.py`).
    keys |= set(re.findall(r"`((?:model|data|training|mesh|eval)\.(?!py`)\w+)(?:=[^`]*)?`", README.read_text()))
    assert len(keys) >= 15
    for key in sorted(keys):
        if key == "KEY":
            continue
        section, _, name = key.partition(".")
        assert section in config and name in config[section], f"README names --config.{key}, which does not exist"


def test_every_repository_file_the_readme_names_exists():
    text = README.read_text()
    paths = set(re.findall(r"(?<![\w/<.])((?:transformer_jax|configs|tests|benchmarks)/[\w/]+\.\w+)", text))
    top_level = ("train.py", "eval.py", "Makefile", "BENCHMARKS.md", "pyproject.toml")
    paths |= {name for name in top_level if name in text}
    # The package map names files relative to the package: `model/attention.py`, `errors.py`.
    section = text.split("## 7. The package map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    paths |= {f"transformer_jax/{path}" for row in rows for path in re.findall(r"`([\w/]+\.py)`", row.split(" | ")[0])}
    assert len(paths) >= 50
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert not missing, f"README names files that do not exist: {missing}"


def test_the_package_map_names_every_module():
    section = README.read_text().split("## 7. The package map", 1)[1].split("\n## ", 1)[0]
    modules = sorted(path.relative_to(ROOT / "transformer_jax").as_posix()
                     for path in (ROOT / "transformer_jax").rglob("*.py"))
    missing = [module for module in modules
               if not module.endswith("__init__.py") and f"`{module}`" not in section]
    assert not missing, f"the README's package map does not list {missing}"


def test_make_targets_in_the_readme_exist():
    targets = set(re.findall(r"^make (\w+)", "\n".join(bash_blocks()), re.M))
    assert targets == {"demo", "test"}
    makefile = (ROOT / "Makefile").read_text()
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no target {target}"
