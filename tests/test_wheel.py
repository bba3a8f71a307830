"""The wheel, installed into a fresh virtualenv outside the checkout, trains the demo and evaluates it from another
directory with its `transformer-jax` command: the configs, the commands and every package travel in it."""

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The demo at the smoke config's sizes (configs/smoke.py): seconds, not minutes.
DEMO_SHRUNK = ["--config.data.builtin_train_size=600", "--config.data.builtin_dev_size=16",
               "--config.data.builtin_test_size=16", "--config.data.vocab_size=500",
               "--config.data.tokenizer_sample_size=1200", "--config.data.tokens_per_batch=512",
               "--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
               "--config.model.num_heads=2", "--config.training.num_train_steps=4",
               "--config.training.warmup_steps=2", "--config.training.log_every=2", "--config.training.eval_every=2",
               "--config.training.checkpoint_every=2", "--config.eval.beam_size=2", "--config.eval.max_extra_length=4"]


def listed_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_pyproject_lists_every_package_of_the_checkout():
    found = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "transformer_jax").rglob("__init__.py")}
    assert found | {"transformer_jax.configs"} == listed_packages()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """A fresh virtualenv holding the wheel built from the checkout's files (its dependencies: this environment's,
    through a .pth line, so nothing is downloaded); returns its bin directory."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"  # the files a source distribution holds: no build output of the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("transformer_jax", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(base / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (base / "dist").glob("*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    site = pathlib.Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig."
                                        "get_paths()['purelib'])"], capture_output=True, text=True,
                                       check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the venv's own
    return venv / "bin"


def run(bin_dir: pathlib.Path, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", JAX_PLATFORMS="cpu")
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_wheel_holds_the_packages_and_configs_and_no_checkout_scripts(installed):
    (wheel,) = (installed.parents[1] / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {os.path.dirname(name).replace("/", ".") for name in names if name.endswith("/__init__.py")}
    assert packages == listed_packages()
    assert "transformer_jax/configs/demo.py" in names and "transformer_jax/aot/gpu_specs/h100_sxm.txtpb" in names
    assert not [name for name in names if name.split("/")[0] in ("configs", "tests", "train.py", "eval.py")]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "transformer-jax = transformer_jax.__main__:main" in entry_points


def test_the_installed_command_trains_the_demo_and_evaluates_it_from_another_directory(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(installed, "python", "-c", "import transformer_jax.configs as c; print(c.__file__)", cwd=elsewhere)
    assert where.stdout.startswith(str(installed.parent)), where.stdout + where.stderr  # the wheel's, not the checkout's
    trained = run(installed, "transformer-jax", "train", "--config=demo", "--workdir=run", *DEMO_SHRUNK, cwd=elsewhere)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "test SacreBLEU" in trained.stdout
    assert sorted(os.listdir(elsewhere / "run" / "checkpoints")) == ["2", "4"]
    scored = run(installed, "transformer-jax", "score", "--workdir=run", "--split=dev", "--mode=greedy",
                 cwd=elsewhere)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "SacreBLEU" in scored.stdout and (elsewhere / "run" / "eval" / "dev.step_4.hyp").is_file()
    (elsewhere / "in.txt").write_text("the dog\n\nthe house\n")
    translated = run(installed, "transformer-jax", "translate", "--workdir=run", "--input=in.txt", cwd=elsewhere)
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert len(translated.stdout.splitlines()) == 3
