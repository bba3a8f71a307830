"""GPU topologies for ahead-of-time compilation, checked without JAX's CUDA plugin (CI does not install it).

With the plugin installed (`pip install "jax[cuda12]==<jax version>"`, JAX_PLATFORMS=cpu) the same
tests check the compile-only devices it builds instead of the error that asks for it.
"""

import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from runs import ROOT, assert_one_line_error, script_env
from transformer_jax.aot.chips import CHIPS, chip_for, gpu_target_config
from transformer_jax.aot.compile import Program, RunShapes, collectives_in
from transformer_jax.aot.report import table, verdict
from transformer_jax.aot.topology import GPU_TYPES, Topology, cuda_plugin_missing, describe
from transformer_jax.errors import ConfigError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.base.sharding import BATCH_AXES

GB = 10**9


def test_gpu_names_are_one_host_of_one_to_eight_gpus():
    assert GPU_TYPES["h100"] == ("h100", 1) and GPU_TYPES["h100-8"] == ("h100", 8)
    assert GPU_TYPES["h200"] == ("h200", 1) and GPU_TYPES["h200-8"] == ("h200", 8)
    assert all(CHIPS[chip].is_gpu for chip, _ in GPU_TYPES.values())
    assert not any(chip.is_gpu for key, chip in CHIPS.items() if key not in ("h100", "h200"))


def test_the_h200_is_the_h100s_chip_with_more_and_faster_memory():
    h100, h200 = CHIPS["h100"], CHIPS["h200"]
    assert h200.peak_bf16_flops == h100.peak_bf16_flops == 989e12  # the same SM90 tensor cores
    assert h200.hbm_bytes == 141e9 and h200.hbm_bytes_per_second == 4.8e12
    assert chip_for("NVIDIA H200") is h200 and chip_for("NVIDIA H200 141GB HBM3e") is h200
    assert chip_for("NVIDIA H100 80GB HBM3") is h100


def test_an_h200_is_compiled_for_like_an_h100_not_as_a_tpu():
    # Before the H200 was in the tables its name went to libtpu ("needs libtpu"); now it is a GPU topology.
    missing = cuda_plugin_missing()
    if missing is None:
        topology = describe("h200")
        assert topology.chip is CHIPS["h200"] and chip_for(topology.devices[0].device_kind) is CHIPS["h200"]
        return
    with pytest.raises(ConfigError) as error:
        describe("h200")
    assert "libtpu" not in str(error.value) and "CUDA plugin" in str(error.value)


def test_describing_gpus_needs_the_cuda_plugin_or_builds_its_devices():
    missing = cuda_plugin_missing()
    if missing is None:  # a host with jax[cuda12] and JAX_PLATFORMS=cpu
        topology = describe("h100-8")
        assert len(topology.devices) == 8 and topology.hosts == 1 and topology.chips == 8
        assert chip_for(topology.devices[0].device_kind) is CHIPS["h100"]
        return
    with pytest.raises(ConfigError) as error:
        describe("h100-8")
    message = str(error.value)
    assert "\n" not in message and f"jax[cuda12]=={jax.__version__}" in message and "JAX_PLATFORMS=cpu" in message


def test_gpu_topologies_are_one_host():
    with pytest.raises(ConfigError, match="GPU topologies are one host"):
        describe("h100-8", num_slices=2)


def test_the_command_names_the_missing_plugin_in_one_line(tmp_path):
    if cuda_plugin_missing() is None:
        pytest.skip("the CUDA plugin is installed here: the error under test cannot occur")
    config = tmp_path / "config.py"
    config.write_text("from transformer_jax.config.schema import default_config\n\n"
                      "def get_config():\n    return default_config()\n")
    result = subprocess.run([sys.executable, "-m", "transformer_jax.aot", f"--config={config}", "--topology=h100-8"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=script_env())
    assert_one_line_error(result, "pip install 'jax[cuda12]==", "JAX_PLATFORMS=cpu")


@pytest.mark.parametrize("key", ["h100", "h200"])
def test_the_stored_gpu_target_configs_match_the_chip_table(key):
    chip = CHIPS[key]
    text = gpu_target_config(chip)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert body.count("{") == body.count("}") > 0 and re.search(r"^gpu_device_info \{", body, re.MULTILINE)

    def field(name):
        return re.search(rf"^\s*{name}: (\S+|\"[^\"]*\")$", body, re.MULTILINE).group(1)

    assert field("core_count") == "132" and field("platform_name") == '"CUDA"'
    assert re.search(r"cuda_compute_capability \{\s*major: 9\b", body)  # Hopper, sm_90
    assert chip_for(field("name").strip('"')) is chip  # the device kind the compile-only devices report
    assert abs(int(field("memory_bandwidth")) / chip.hbm_bytes_per_second - 1) < 0.01
    assert chip.hbm_bytes <= int(field("device_memory_size")) < 1.1 * chip.hbm_bytes


def gpu_report(peak_gb: float) -> str:
    """The report of a one-program run whose train step needs `peak_gb` on one H100 (CPU devices stand in)."""
    topology = Topology("h100", tuple(jax.devices("cpu")[:1]), CHIPS["h100"], 1)
    shapes = RunShapes(TransformerConfig(vocab_size=1000, dtype="bfloat16"), rows=8, width=256)
    program = Program("train step 8x256", int(peak_gb * GB), 0, 0, 0, 0, 1e12, 1e10, {})
    result = verdict(shapes, [program], topology, accumulation=1)
    mesh = Mesh(np.asarray(topology.devices).reshape(1, 1), BATCH_AXES)
    return table(topology, mesh, shapes, [program], result, accumulation=1)


def test_the_report_speaks_of_gpus_and_of_jax_preallocation():
    small, large = gpu_report(10), gpu_report(70)
    assert "h100: NVIDIA H100 SXM5, 1 GPU(s) on 1 host" in small and "slice" not in small
    assert "rows per GPU" in small and "per GPU of 80.00 GB HBM" in small and "attention=auto" in small
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in small  # 10 GB is under JAX's 75% preallocation
    assert "JAX preallocates 75% of GPU memory (60.00 GB)" in large and "XLA_PYTHON_CLIENT_MEM_FRACTION" in large


def test_an_async_all_reduce_counts_all_its_outputs():
    # XLA:GPU combines gradients into one all-reduce-start whose result is the outputs alone, not (operands, outputs).
    hlo = "\n".join([
        "  %ars = (f32[512,2048]{1,0}, f32[2048]{0}) all-reduce-start(f32[512,2048]{1,0} %a, f32[2048]{0} %b)",
        "  %ard = (f32[512,2048]{1,0}, f32[2048]{0}) all-reduce-done((f32[512,2048]{1,0}, f32[2048]{0}) %ars)",
    ])
    assert collectives_in(hlo) == {"all-reduce": (1, (512 * 2048 + 2048) * 4)}


def test_the_cuda_13_plugin_counts_as_a_cuda_plugin(monkeypatch):
    """jax[cuda13] installs jax_plugins.xla_cuda13: GPU topologies are then not refused for a missing plugin."""
    import importlib.util

    real = importlib.util.find_spec
    present = {"jax_plugins", "jax_plugins.xla_cuda13"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: object() if name in present else (None if name.startswith("jax_plugins")
                                                                                else real(name, *args)))
    message = cuda_plugin_missing()
    assert message is None or "needs a CUDA plugin" not in message
    present.discard("jax_plugins.xla_cuda13")
    assert "needs a CUDA plugin" in cuda_plugin_missing()
