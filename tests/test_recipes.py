"""Every preflight command the README and docs/*.md show runs, and ends as they say: `fits`.

What is run, and how:
- Every `transformer-jax preflight ...` line of a ```bash block (continuation lines joined; also the
  `python -m transformer_jax.aot ...` form), as `python -m transformer_jax preflight ...` with this interpreter
  whatever the page names (`transformer-jax`, `~/cuda-venv/bin/transformer-jax`) and with the environment
  assignments the page puts before it (`JAX_PLATFORMS=cpu`).
- Corpus arguments (`--config.data.prepared=...`, `--workdir=...`) of commands on the WMT configs are
  dropped, and those commands compile rows of data.max_length: their corpus is WMT14 (in a bucket or a
  run directory), which a test cannot download, and a WMT config refuses a corpus prepared from other
  data settings. The commands on other configs (the rehearsal's, configs/smoke.py) run as shown, their
  relative paths (`runs/...`) moved under a temporary directory, after the pages' own
  `transformer-jax prepare` lines on those configs have made the corpus they name.
- Commands that are the same after that run once (the README's pod preflight is the pod recipe's).
- TPU preflights of WMT configs run with one layer per stack (SHALLOW), the README's pod preflight included: the
  same mesh, sharding, widths and programs. The pod preflight's full-size output (6 layers: 1.31 GB of 16 GB a
  device, `fits`) is a raw file of 2026-12-07, benchmarks/results/preflight-readme-pod-2026-12-07.txt, 96 s of CPU
  there against 40 s with one layer.
- TPU topologies need libtpu (the `tpu` extra) and run with JAX_PLATFORMS=cpu. GPU topologies (`h100...`)
  run with exactly the environment the page shows, since `JAX_PLATFORMS=cpu` is part of what a reader
  must type: where JAX's CUDA plugin (jax[cuda12] or jax[cuda13]) is importable they compile and must
  fit; elsewhere (CI) they must stop with the one-line error that names the plugin to install.

Runtime on 2 CPU cores (2026-12-07): the pod preflight (base on v5e-256) with one layer about 40 s of CPU (96 s
with six), the big model on v5p:4x4x8 with one layer about 48 s (2 minutes with six), the rehearsal's prepare and
preflight about 12 s, each GPU command a few seconds without the plugin and about a minute with it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from runs import ROOT, assert_one_line_error
from test_readme import bash_blocks, doc_pages
from transformer_jax.aot.topology import CUDA_PLUGINS, GPU_TYPES

AOT, PREPARE = "transformer_jax.aot", "transformer_jax.cli.prepare"
PROGRAM_COMMANDS = {AOT: "preflight", PREPARE: "prepare"}  # the `transformer-jax` command of each module
CORPUS_FLAGS = ("--config.data.prepared=", "--workdir=", "--output=")
# TPU preflights on WMT configs (the README's base model on v5e-256, the big model with fsdp=2 on v5p:4x4x8) run
# with one layer of each stack: the same mesh, sharding, widths and programs, each layer compiled alike, in a
# fraction of the time (2 cores: the base model on v5e-256 96 s of CPU at six layers, 40 s at one; the big model
# about 115 s at six, of which the six-layer train step alone is most). Six layers fit with room to spare (the pod
# preflight's raw file: 1.31 GB of a v5e chip's 16 GB).
SHALLOW = "--config.model.num_layers=1"


@dataclasses.dataclass(frozen=True)
class Command:
    """One `transformer-jax COMMAND ARGS` (or `python -m MODULE ARGS`) line of a page, with the environment
    assignments before it."""

    module: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    page: str

    @property
    def wmt(self) -> bool:
        """Whether it runs a WMT config, whose corpus a test cannot make."""
        return any(arg.startswith("--config=configs/wmt14_") for arg in self.args)

    @property
    def topology(self) -> str:
        """The --topology it compiles for."""
        return next(arg.split("=", 1)[1] for arg in self.args if arg.startswith("--topology="))

    @property
    def gpu(self) -> bool:
        """Whether that topology is GPUs (JAX's CUDA plugin builds them)."""
        return self.topology in GPU_TYPES

    def runnable(self, full_size: bool = True) -> Command:
        """The command as the test runs it: corpus arguments of WMT configs dropped (see the module docstring), and
        unless `full_size`, a TPU preflight's model cut to one layer (see SHALLOW)."""
        if not self.wmt:
            return self
        args = tuple(a for a in self.args if not a.startswith(CORPUS_FLAGS))
        if not full_size and not self.gpu:
            args += (SHALLOW,)
        return dataclasses.replace(self, args=args)

    def argv(self, scratch: pathlib.Path) -> list[str]:
        """This interpreter running the command (`python -m transformer_jax COMMAND`), its relative corpus paths
        moved under `scratch`."""
        def moved(arg: str) -> str:
            flag = next((f for f in CORPUS_FLAGS if arg.startswith(f)), None)
            if flag is None:
                return arg
            path = arg[len(flag):]
            assert not path.startswith(("/", "~", "gs://")), f"{self.page}: the test cannot make {path}"
            return flag + str(scratch / path)
        return [sys.executable, "-m", "transformer_jax", PROGRAM_COMMANDS[self.module], *map(moved, self.args)]


def shown_commands(module: str) -> list[Command]:
    """Every line of the pages' bash blocks that runs `transformer-jax COMMAND` (module's) or `python -m module`."""
    name = PROGRAM_COMMANDS[module]
    commands = []
    for path, text in doc_pages():
        for line in "\n".join(bash_blocks(text)).splitlines():
            if f"-m {module}" not in line and f"transformer-jax {name}" not in line:
                continue
            words = shlex.split(line, comments=True)
            start = next((i for i in range(len(words) - 1) if words[i:i + 2] == ["-m", module] and i > 0
                          or words[i].split("/")[-1] == "transformer-jax" and words[i + 1] == name), None)
            if start is None:
                continue  # named in a comment only
            runner = start - 1 if words[start] == "-m" else start  # `python -m MODULE` or `transformer-jax NAME`
            if words[start] == "-m":
                assert words[runner].endswith(("python", "python3")), f"{path.name}: who runs {line!r}?"
            env = tuple(tuple(word.split("=", 1)) for word in words[:runner] if "=" in word)
            commands.append(Command(module, tuple(words[start + 2:]), env, path.name))
    return commands


def preflights() -> list[Command]:
    """The pages' preflight commands as the test runs them, each once, in the order the pages show them."""
    runnable = [command.runnable(full_size=False) for command in shown_commands(AOT)]
    once = {(c.args, c.env): c for c in reversed(runnable)}
    return sorted(once.values(), key=runnable.index)


def test_the_pages_show_the_recipes_preflights():
    """What the pages must show: the pod's, the GPU host's and a corpus-shaped preflight (here and in the README)."""
    shown = shown_commands(AOT)
    assert {c.page for c in shown} >= {"README.md", "scaling.md"}
    topologies = {c.topology for c in shown}
    assert {"v5e-256", "h100-8"} <= topologies, topologies
    assert any(arg.startswith("--config.data.prepared=gs://") for c in shown for arg in c.args)  # the pod's corpus
    assert any(not c.wmt and any(a.startswith(CORPUS_FLAGS) for a in c.args) for c in shown)  # one runs on a corpus
    for command in shown:
        if command.gpu:  # a reader types what the page shows: a GPU preflight needs the CPU platform
            assert ("JAX_PLATFORMS", "cpu") in command.env, f"{command.page}: {' '.join(command.args)}"
    assert len(preflights()) < len(shown)  # some repeat; they run once


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> pathlib.Path:
    """A directory holding the corpora the pages' prepare commands make (those a test can make)."""
    directory = tmp_path_factory.mktemp("recipes")
    prepares = [c for c in shown_commands(PREPARE)
                if not c.wmt and not any(a.startswith("--output=gs://") for a in c.args)]
    assert prepares, "no page prepares a corpus a test can make"
    for command in prepares:
        result = subprocess.run(command.argv(directory), cwd=ROOT, capture_output=True, text=True, timeout=600,
                                env=dict(os.environ, JAX_PLATFORMS="cpu", **dict(command.env)))
        assert result.returncode == 0, f"{command.page}: {' '.join(command.args)}\n{result.stderr[-3000:]}"
    return directory


def cuda_plugin_installed() -> bool:
    """Whether JAX's CUDA 12 or 13 plugin is importable here."""
    return importlib.util.find_spec("jax_plugins") is not None and any(
        importlib.util.find_spec(plugin) is not None for plugin in CUDA_PLUGINS)


@pytest.mark.parametrize("command", preflights(), ids=lambda c: " ".join(c.args).replace("--config=configs/", ""))
def test_the_shown_preflight_runs_and_fits(command: Command, request: pytest.FixtureRequest, tmp_path: pathlib.Path):
    # The pages' corpora (scratch) are made only for a command that names one: a worker running only WMT and GPU
    # preflights (whose corpus arguments are dropped) prepares none.
    names_corpus = any(arg.startswith(CORPUS_FLAGS) for arg in command.args)
    scratch = request.getfixturevalue("scratch") if names_corpus else tmp_path
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    if not command.gpu:
        pytest.importorskip("libtpu", reason="TPU topologies need the tpu extra (libtpu), which `make test` installs")
        env["JAX_PLATFORMS"] = "cpu"
    env.update(command.env)
    result = subprocess.run(command.argv(scratch), cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    if command.gpu and not cuda_plugin_installed():
        assert_one_line_error(result, "compiling for GPUs needs a CUDA plugin", "pip install 'jax[cuda12]==",
                              "jax[cuda13]")
        return
    assert result.returncode == 0, f"{command.page}: {' '.join(command.args)}\n{result.stderr[-3000:]}"
    assert result.stdout.rstrip().splitlines()[-1] == "fits", result.stdout[-3000:]
