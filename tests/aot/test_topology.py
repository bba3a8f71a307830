"""Topology names: each form --topology takes is let through to libtpu or the CUDA plugin, anything else is named
as unknown with the forms listed, and "needs libtpu" is said only of a TPU topology when libtpu is missing.

No libtpu needed: the name check comes first, and the command's subprocess runs with libtpu unimportable.
"""

import subprocess
import sys

import pytest

from runs import ROOT, assert_one_line_error, script_env
from transformer_jax.aot.topology import CLOUD_TYPES, GPU_TYPES, check_name
from transformer_jax.errors import ConfigError

SMOKE = str(ROOT / "configs" / "smoke.py")


@pytest.mark.parametrize("name", ["v5e:16x16", "v4:4x4x4", "v5p:2x2x1", "v6e:8x8", "v5e-12", *CLOUD_TYPES, *GPU_TYPES])
def test_every_form_of_a_name_passes_the_check(name):
    check_name(name)


@pytest.mark.parametrize("name", ["v9:2x2", "v5e", "v5e:", "v5e:0x2", "v5e:2x2x2x2", "v5e:2 x2", "tpu-v5e-8", "a100-8",
                                  "h100-3", "H100-8", "v5e-", "v5e_8", "2x2"])
def test_a_name_of_no_form_is_unknown_and_the_forms_are_listed(name):
    with pytest.raises(ConfigError, match=rf"unknown topology '{name}'; use a TPU topology as VERSION:AxB") as raised:
        check_name(name)
    for known in ("v4, v5e, v5p, v6e", "v5e:16x16", "v5e-256", "h100-8", "h200"):
        assert known in str(raised.value)


def run_preflight_without_libtpu(tmp_path, topology: str) -> subprocess.CompletedProcess:
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("raise ImportError(\"No module named 'libtpu'\", name='libtpu')\n")
    return subprocess.run([sys.executable, "-m", "transformer_jax.aot", f"--config={SMOKE}", f"--topology={topology}"],
                          cwd=ROOT, env=script_env(PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
                          timeout=300)


def test_the_command_names_an_unknown_topology_not_libtpu(tmp_path):
    line = assert_one_line_error(run_preflight_without_libtpu(tmp_path, "v5e-2x2"), "unknown topology 'v5e-2x2'",
                                 "VERSION:AxB", "v5e:16x16", "h100-8")
    assert "libtpu" not in line


def test_the_command_says_needs_libtpu_only_for_a_tpu_topology(tmp_path):
    assert_one_line_error(run_preflight_without_libtpu(tmp_path, "v5e:2x4"),
                          "the TPU topology v5e:2x4 needs libtpu, which is not installed",
                          "pip install 'transformer-jax[tpu]'")
