"""The sharded train step gives one device's results on data=8 and data=4 x fsdp=2 meshes (an initial state made
whole and placed is the mesh's own); CPU device counts."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from runs import cpu_xla_flags
from transformer_jax.errors import ConfigError, MeshError
from transformer_jax.base.sharding import make_mesh, set_cpu_devices
from transformer_jax.checkpoints.manager import Checkpointer

# Runs in a fresh interpreter: the host-device count must be set before JAX starts.
MESH_SCRIPT = textwrap.dedent(
    """
    import itertools, json, sys
    import jax, numpy as np, optax
    from transformer_jax import Transformer, TransformerConfig
    from jax.sharding import SingleDeviceSharding
    from transformer_jax.base.sharding import global_batch, init_sharded, make_mesh, place_whole
    from transformer_jax.checkpoints.manager import Checkpointer
    from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
    from transformer_jax.training.state import create_train_state
    from transformer_jax.training.step import train_step

    # One layer: how a step splits over a mesh does not depend on the depth (each layer splits alike).
    model = Transformer(TransformerConfig.preset("tiny", vocab_size=64, num_layers=1))
    config = model.config
    optimizers = {"sgd": optax.sgd(0.5), "adam": paper_optimizer(paper_learning_rate(config.d_model, warmup_steps=10))}
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, 64, size=(16, 9)).astype(np.int32)
    tokens[8:, 6:] = 0  # some padding
    batch = {"inputs": tokens, "targets": tokens,
             "target_inputs": np.concatenate([np.full((16, 1), 2, np.int32), tokens[:, :-1]], 1)}
    results = {}
    meshes = {"one": (1, 1, jax.devices()[:1]), "data8": (8, 1, None), "data4_fsdp2": (4, 2, None)}
    for (name, (data, fsdp, devices)), (opt_name, optimizer) in itertools.product(meshes.items(), optimizers.items()):
        if (name, opt_name) == ("data8", "adam"):
            continue  # Adam's losses are compared on the other meshes; parameters after SGD on all three
        mesh = make_mesh(data, fsdp, devices)
        state, shardings = init_sharded(lambda: create_train_state(model, optimizer, seed=0), mesh)
        if name == "one" and opt_name == "adam":  # made whole on one device (the one-device mesh), kept on the host
            whole = jax.device_get(state)
            assert all(leaf.sharding.is_equivalent_to(SingleDeviceSharding(jax.devices()[0]), leaf.ndim)
                       for leaf in jax.tree.leaves(state))
        if name == "data4_fsdp2" and opt_name == "adam":  # then placed on the 4x2 mesh: the same
            placed = place_whole(whole, shardings)
            results["placed_equal"] = jax.tree.structure(placed) == jax.tree.structure(state) and all(
                a.sharding == b.sharding and np.array_equal(a, b)
                for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(state)))
        step = jax.jit(train_step, static_argnums=2, in_shardings=(shardings, None),
                       out_shardings=(shardings, None), donate_argnums=0)
        losses = []
        for _ in range(3):
            state, metrics = step(state, global_batch(batch, mesh), 0.1)
            losses.append(float(metrics["loss"]))
        leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
        kernel = state.params["encoder"]["layer_0"]["feed_forward"]["inner"]["kernel"]
        results[f"{name}/{opt_name}"] = {
            "losses": losses, "params": [x.ravel().tolist() for x in leaves],
            "kernel_shards": len({str(s.index) for s in kernel.value.addressable_shards})}
        if name == "data4_fsdp2" and opt_name == "adam":  # a checkpoint written by a 4x2 mesh
            checkpointer = Checkpointer(sys.argv[1])
            checkpointer.save(3, state, {}, {})
            checkpointer.close()
    print(json.dumps(results))
    """
)


def test_mesh_results_equal_one_device(tmp_path):
    env = dict(os.environ, XLA_FLAGS=cpu_xla_flags(8), JAX_PLATFORMS="cpu")
    checkpoints = str(tmp_path / "checkpoints")
    run = subprocess.run([sys.executable, "-c", MESH_SCRIPT, checkpoints], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for mesh in ("data8", "data4_fsdp2"):
        for opt in ("sgd", "adam") if mesh == "data4_fsdp2" else ("sgd",):
            one, other = results[f"one/{opt}"], results[f"{mesh}/{opt}"]
            assert max(abs(a - b) for a, b in zip(one["losses"], other["losses"])) < 1e-5, (mesh, opt)
        # Parameters are compared after SGD steps. After Adam steps they agree to round-off in
        # all but a few elements: where a gradient is mathematically zero (e.g. directions the
        # softmax cancels), Adam's g / (sqrt(v) + 1e-9) turns float round-off, which depends on
        # the summation order across devices, into an update of size ~lr.
        one, other = results["one/sgd"], results[f"{mesh}/sgd"]
        for a, b in zip(one["params"], other["params"]):
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, mesh
    # The state made whole on one device and placed on the 4x2 mesh is the one its devices made.
    assert results["placed_equal"] is True
    # fsdp=2 really shards parameters: the d_model axis of a kernel is split in two.
    assert results["data4_fsdp2/adam"]["kernel_shards"] == 2
    assert results["data8/sgd"]["kernel_shards"] == 1
    # The checkpoint the 8-device mesh wrote restores here, on one device (e.g. to evaluate).
    restored = jax.tree.leaves(Checkpointer(checkpoints, read_only=True).restore_params(3))
    saved = results["data4_fsdp2/adam"]["params"]
    assert len(restored) == len(saved)
    for got, want in zip(restored, saved):
        np.testing.assert_array_equal(np.asarray(got).ravel(), np.asarray(want, np.float32))


def test_mesh_that_does_not_cover_the_devices_is_a_clear_error():
    with pytest.raises(MeshError, match="does not cover the 1 available devices"):
        make_mesh(data=2, fsdp=1)


# Prints what set_cpu_devices returned and the devices JAX then has (a fresh interpreter each time).
CPU_DEVICES_SCRIPT = (
    "import sys, jax; from transformer_jax.base.sharding import set_cpu_devices; "
    "count = set_cpu_devices(None if sys.argv[1] == 'default' else int(sys.argv[1])); "
    "print(count, jax.device_count(), jax.devices()[0].platform)"
)


def cpu_devices_after(argument: str, **environment: str) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", **environment)
    run = subprocess.run([sys.executable, "-c", CPU_DEVICES_SCRIPT, argument], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()


def test_cpu_devices_default_to_one_per_core_unless_the_user_chose():
    cores = str(min(len(os.sched_getaffinity(0)), 8))
    assert cpu_devices_after("default") == [cores, cores, "cpu"]
    assert cpu_devices_after("0") == [cores, cores, "cpu"]
    # A device count the user set in XLA_FLAGS or JAX_NUM_CPU_DEVICES stands, unless one is passed.
    forced = "--xla_force_host_platform_device_count=3"
    assert cpu_devices_after("default", XLA_FLAGS=forced) == ["None", "3", "cpu"]
    assert cpu_devices_after("default", JAX_NUM_CPU_DEVICES="5") == ["None", "5", "cpu"]
    assert cpu_devices_after("2", XLA_FLAGS=forced) == ["2", "2", "cpu"]


def test_negative_cpu_devices_is_a_config_error():
    with pytest.raises(ConfigError, match="cpu_devices=-1 must be >= 0"):
        set_cpu_devices(-1)


def test_cpu_devices_once_jax_started_keep_its_count_or_are_a_config_error():
    started = len(jax.devices("cpu"))  # JAX runs in this process from here on
    assert set_cpu_devices(None) is None
    assert set_cpu_devices(started) in (None, started)
    with pytest.raises(ConfigError, match=f"JAX already started with {started} CPU device"):
        set_cpu_devices(started + 1)
