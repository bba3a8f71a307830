"""Layer scanning and rematerialization: same function and gradients as the plain stack."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from runs import cpu_xla_flags
from transformer_jax import Transformer, TransformerConfig
from transformer_jax.errors import ConfigError
from transformer_jax.model import DECODING_COLLECTIONS
from transformer_jax.model.stacks import scanned_layout, unscanned_layout
from transformer_jax.base.sharding import LOGICAL_AXIS_RULES
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import create_train_state


def decoding_state_shapes(state):
    """{'collection/path/to/leaf': shape} of the decoding state."""
    return {"/".join(path): x.shape for path, x in traverse_util.flatten_dict(state).items()}


def _params(config, src, tgt_in):
    return nn.meta.unbox(Transformer(config).init(jax.random.key(0), src, tgt_in)["params"])


# The key projection has no bias (the softmax cancels it).
ATTENTION = ("query/kernel", "query/bias", "key/kernel", "value/kernel", "value/bias", "out/kernel",
             "out/bias")
ENCODER_LAYER = (
    {f"self_attention/{p}" for p in ATTENTION}
    | {f"feed_forward/{p}/{q}" for p in ("inner", "outer") for q in ("kernel", "bias")}
    | {f"{n}_norm/{q}" for n in ("self_attention", "feed_forward") for q in ("scale", "bias")}
)
DECODER_LAYER = (
    ENCODER_LAYER | {f"cross_attention/{p}" for p in ATTENTION}
    | {f"cross_attention_norm/{q}" for q in ("scale", "bias")}
)


@pytest.mark.parametrize("remat", ["none", "full"])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_parameter_paths_are_the_checkpoint_layout(tiny_config, token_batch, scan_layers, remat):
    """The parameter names checkpoints hold: scanning renames only `layer_i` -> `layers`; remat nothing."""
    config = tiny_config.replace(scan_layers=scan_layers, remat=remat)
    shapes = jax.eval_shape(lambda: _params(config, *token_batch))
    paths = set(traverse_util.flatten_dict(shapes, sep="/"))
    layers = ["layers"] if scan_layers else [f"layer_{i}" for i in range(config.num_layers)]
    assert paths == (
        {"shared_embedding/embedding"}
        | {f"encoder/{layer}/{p}" for layer in layers for p in ENCODER_LAYER}
        | {f"decoder/{layer}/{p}" for layer in layers for p in DECODER_LAYER}
    )
    if scan_layers:
        assert {x.shape[0] for k, x in traverse_util.flatten_dict(shapes, sep="/").items()
                if "/layers/" in k} == {config.num_layers}


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_scanned_stack_computes_the_same_function(tiny_config, token_batch, norm_position):
    config = tiny_config.replace(norm_position=norm_position)
    src, tgt_in = token_batch
    params = _params(config, src, tgt_in)
    scanned = config.replace(scan_layers=True)
    converted = scanned_layout(params)
    # The converted tree has exactly the structure and shapes a scanned model initializes.
    expected = jax.eval_shape(lambda: _params(scanned, src, tgt_in))
    assert jax.tree.map(jnp.shape, converted) == jax.tree.map(jnp.shape, expected)
    full = Transformer(config).apply({"params": params}, src, tgt_in)
    stacked = Transformer(scanned).apply({"params": converted}, src, tgt_in)
    np.testing.assert_allclose(stacked, full, atol=1e-5, rtol=1e-5)
    back = unscanned_layout(converted)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, back, params)))


def _gradients(config, params, src, tgt_in):
    """d/dparams of sum(logits**2), with dropout on (a fixed key)."""
    def loss(p):
        logits = Transformer(config).apply({"params": p}, src, tgt_in, deterministic=False,
                                           rngs={"dropout": jax.random.key(7)})
        return jnp.sum(logits**2)
    return jax.jit(jax.grad(loss))(params)


@pytest.fixture(scope="module")
def stored_gradients():
    """The plain stack's parameters and gradients, computed once for both remat policies. One layer per stack:
    the gradient still flows from one rematerialized layer into another (the decoder's into the encoder's, through
    cross-attention), as in a deeper stack; a second layer per stack would add compile time, not a path."""
    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=32, num_layers=1)  # tiny_config, 1 layer
    src = jnp.array([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 0, 0]], jnp.int32)  # as token_batch: padding in row 2
    tgt_in = jnp.array([[2, 13, 14, 15, 16], [2, 17, 18, 0, 0]], jnp.int32)
    params = _params(config, src, tgt_in)
    return config, params, (src, tgt_in), _gradients(config, params, src, tgt_in)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_rematerialized_gradients_equal_the_stored_ones(stored_gradients, remat):
    config, params, batch, plain = stored_gradients
    recomputed = _gradients(config.replace(remat=remat), params, *batch)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(recomputed)):
        # Recomputation may reorder float32 sums: compare against each leaf's own scale.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(np.max(np.abs(b)))))


def test_scanned_remat_trains_with_dropout(tiny_config, token_batch):
    """Scan + remat: each layer gets its own dropout mask, and the gradient is finite and non-zero."""
    src, tgt_in = token_batch
    config = tiny_config.replace(scan_layers=True, remat="full", dropout_rate=0.5)
    params = _params(config, src, tgt_in)
    loss = lambda p: jnp.sum(Transformer(config).apply(
        {"params": p}, src, tgt_in, deterministic=False, rngs={"dropout": jax.random.key(1)}) ** 2)
    grads = jax.jit(jax.grad(loss))(params)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads["encoder"]["layers"])]
    assert all(np.isfinite(norms)) and all(n > 0 for n in norms)
    # Same parameters per layer, different dropout per layer: the layers' outputs must differ.
    same = jax.tree.map(lambda x: jnp.broadcast_to(x[:1], x.shape), params["encoder"]["layers"])
    tied = {**params, "encoder": {**params["encoder"], "layers": same}}
    _, state = Transformer(config.replace(attention_dropout_rate=0.0)).apply(
        {"params": tied}, src, deterministic=False, rngs={"dropout": jax.random.key(1)},
        method=Transformer.encode, capture_intermediates=lambda m, _: m.name == "feed_forward",
        mutable=["intermediates"])
    outputs = jax.tree.leaves(state["intermediates"])[0]  # [N, B, S, d_model]
    assert outputs.shape[0] == config.num_layers and not np.allclose(outputs[0], outputs[1])


def test_scanned_cached_decoding_equals_full_forward(tiny_config, token_batch):
    config = tiny_config.replace(scan_layers=True)
    src, _ = token_batch
    tgt_in = jnp.array([[2, 13, 14, 15, 16], [2, 17, 18, 19, 20]])
    # The plain stack's parameters in the scanned layout (test_scanned_stack_computes_the_same_function shows it is
    # the scanned model's own); test_scanned_remat_trains_with_dropout initializes a scanned stack itself.
    params = scanned_layout(_params(tiny_config, src, tgt_in))
    full = Transformer(config).apply({"params": params}, src, tgt_in)
    model = Transformer(config, decoding=True)
    encoded = model.apply({"params": params}, src, method=Transformer.encode)
    _, state = model.apply({"params": params}, encoded, src, jnp.ones_like(tgt_in),
                           method=Transformer.decode, mutable=DECODING_COLLECTIONS)
    # Each kind of state in its own collection; every layer's leaves gain a leading layer axis.
    layers, (batch, length), kv = config.num_layers, tgt_in.shape, (config.num_heads, config.head_dim)
    assert decoding_state_shapes(state) == {
        "cache/decoder/beam_slots": (batch, length),
        "slot_cache/decoder/layers/self_attention/cached_key_0": (layers, batch, *kv, length),
        "slot_cache/decoder/layers/self_attention/cached_value_0": (layers, batch, kv[0], length, kv[1]),
        "encoder_cache/decoder/layers/cross_attention/key": (layers, batch, *kv, src.shape[1]),
        "encoder_cache/decoder/layers/cross_attention/value": (layers, batch, kv[0], src.shape[1], kv[1]),
        "decode_step/decoder/layers/self_attention/cache_index": (layers,),
        "decode_step/decoder/position": (),
    }
    # One compiled step, as a decoder runs it (applied eagerly, the scan recompiled at every position).
    step = jax.jit(lambda variables, token: model.apply(variables, encoded, src, token, method=Transformer.decode,
                                                        mutable=DECODING_COLLECTIONS))
    steps = []
    for t in range(tgt_in.shape[1]):
        logits, state = step({"params": params, **state}, tgt_in[:, t : t + 1])
        steps.append(logits[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_scanned_parameters_shard_over_fsdp_but_not_over_layers():
    config = TransformerConfig.preset("tiny", scan_layers=True)
    model = Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(config.d_model))
    abstract = jax.eval_shape(lambda: create_train_state(model, optimizer, 0))
    logical = nn.get_partition_spec(abstract.params)["encoder"]["layers"]["feed_forward"]["inner"]["kernel"]
    assert tuple(logical) == ("layers", "embed", "mlp")
    assert tuple(nn.logical_to_mesh_axes(logical, LOGICAL_AXIS_RULES)) == (None, "fsdp", None)


def test_unknown_remat_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="remat"):
        TransformerConfig(remat="everything")


ROWS_SPLIT_SCRIPT = """
import json
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from transformer_jax.base.sharding import make_mesh
from transformer_jax.model.stacks import rows_split
specs = {}
for name, (data, fsdp, rows) in {"fsdp": (2, 2, 8), "data": (4, 1, 8), "fsdp, rows not divisible": (2, 2, 6)}.items():
    mesh = make_mesh(data, fsdp)
    x = jax.device_put(jnp.ones((rows, 3, 4)), NamedSharding(mesh, PartitionSpec()))  # replicated
    with jax.set_mesh(mesh):
        out = jax.jit(lambda y: rows_split(y + 1))(x)
    specs[name] = [list(a) if isinstance(a, tuple) else a for a in out.sharding.spec]
print(json.dumps(specs))
"""


def test_rows_split_keeps_activations_split_by_rows_only_where_parameters_are_sharded():
    # On an fsdp mesh the partitioner would otherwise split activations along d_model, as the parameters
    # are (BENCHMARKS.md, Accelerators: 2.6x the HBM bytes of the data-parallel step on v5e-8).
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS=cpu_xla_flags(4), JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", ROWS_SPLIT_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    specs = json.loads(run.stdout.strip().splitlines()[-1])
    assert specs["fsdp"][0] == ["data", "fsdp"]  # a replicated input comes out split by rows over both axes
    assert not any(specs["data"]) and not any(specs["fsdp, rows not divisible"])  # untouched: still replicated
