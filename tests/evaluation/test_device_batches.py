"""Translation batches sized for the devices: the run's on CPUs, the devices' memory elsewhere, and a search at the
sized batches that the accelerator's own compiler fits in the share it was sized for."""

import jax
import pytest

from runs import tiny_run_config
from transformer_jax.aot import describe, run_programs
from transformer_jax.aot.topology import host_devices
from transformer_jax.base import make_mesh
from transformer_jax.config import decode_options, decoding_dtype, translation_batching
from transformer_jax.data.shapes import (
    MAX_SEARCH_SENTENCES_PER_DEVICE,
    SEARCH_MEMORY_SHARE,
    TRANSLATION_BUCKETS,
    TranslationBatching,
    widest_translation_width,
)
from transformer_jax.evaluation import device_memory_bytes, sized_batching
from transformer_jax.model import TransformerConfig

MODEL = TransformerConfig.preset("tiny")


def test_on_cpus_the_runs_own_batching_stays_and_nothing_is_said():
    run = TranslationBatching(64, 0)
    mesh = make_mesh(devices=jax.local_devices())
    assert device_memory_bytes(jax.local_devices()) is None  # a CPU does not say
    assert sized_batching(run, MODEL, decode_options(tiny_run_config()), "", mesh, memory=10**12) == (run, None)


@pytest.fixture(scope="module")
def tpu_host():
    """One host of a compile-only v5e-8 (4 chips on the first host), and the tiny run's programs on it."""
    topology = describe("v5e-8")
    mesh = make_mesh(devices=host_devices(topology), where="v5e-8's first host")
    config = tiny_run_config()
    config.model.max_len = 128
    return topology, mesh, config, run_programs(config, mesh)


def test_accelerators_size_batches_by_memory_and_say_so_once_per_search(tpu_host):
    topology, mesh, config, _ = tpu_host
    assert device_memory_bytes(list(mesh.devices.flat)) is None  # compile-only: the caller gives the chip's HBM
    options = decode_options(config)
    small, line = sized_batching(translation_batching(config), MODEL, options, "", mesh, memory=2 * 10**8)
    large, _ = sized_batching(translation_batching(config), MODEL, options, "", mesh, memory=8 * 10**8)
    assert small.batch_size % mesh.size == 0 and small.batch_size < large.batch_size
    assert f"{mesh.size} x TPU v5 lite" in line and "beam search" in line and str(small.batch_size) in line
    greedy, _ = sized_batching(translation_batching(config), MODEL, options.replace(mode="greedy"), "", mesh,
                               memory=2 * 10**8)
    assert greedy.batch_size > small.batch_size  # one hypothesis a sentence, not beam_size


# The narrowest width (the most rows: batch_size) and the widest the tiny run translates (max_len 128: the fewest
# rows, by the token budget, and the most bytes a sentence, its encoder's 128 x 128 scores the most of them).
@pytest.mark.parametrize("width", [TRANSLATION_BUCKETS[0], widest_translation_width(128)])
def test_the_tpu_compiler_fits_the_sized_search_in_its_share_of_memory(tpu_host, width):
    topology, mesh, config, programs = tpu_host
    memory = 5 * 10**7  # a budget that binds: fewer rows than MAX_SEARCH_SENTENCES_PER_DEVICE
    options, dtype = decode_options(config), decoding_dtype(config)
    batching, _ = sized_batching(translation_batching(config), programs.model_config, options, dtype, mesh,
                                 memory=memory)
    _, lowered = programs.lower_search(options, dtype, width, batching=batching, mesh=mesh)
    analysis = lowered.compile().memory_analysis()
    held = analysis.temp_size_in_bytes + analysis.argument_size_in_bytes + analysis.output_size_in_bytes
    rows = programs.search_shape(width, batching, mesh)[0] // mesh.size
    assert 8 <= rows < MAX_SEARCH_SENTENCES_PER_DEVICE  # the budget gave a real batch, not the minimum nor the cap
    assert held <= SEARCH_MEMORY_SHARE * memory
