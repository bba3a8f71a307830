"""The accelerator peer: the Flax WMT example's train step and beam search, read from a local google/flax checkout.

`examples/wmt/models.py` (and `decode.py` for the search) are loaded from the checkout named on the command
line (`--flax_checkout DIR`); nothing is downloaded and nothing of it is copied into this repository. The step
is the example's `train_step` as its `train.py` writes it (label-smoothed cross-entropy over `log_softmax` of
the logits, weighted by non-padding targets, accuracy from `argmax`), run under `jax.jit` on a mesh instead of
`pmap` (the same per-device program: the batch split over the devices, gradients all-reduced), with the
paper's Adam (0.9, 0.98, 1e-9) and warm-up schedule. The example's own architecture choices stay: pre-LN,
attention dropout equal to the residual dropout, a bias on every projection.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.base import batch_sharding
from transformer_jax.model import TransformerConfig
from transformer_jax.training import paper_learning_rate, paper_optimizer


def load_example(checkout: str, name: str = "models") -> ModuleType:
    """`examples/wmt/<name>.py` of a google/flax checkout, imported as a module of its own."""
    path = pathlib.Path(checkout).expanduser() / "examples" / "wmt" / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"--flax_checkout={checkout} has no examples/wmt/{name}.py; give the root of a google/flax "
                         "checkout (git clone https://github.com/google/flax)")
    spec = importlib.util.spec_from_file_location(f"flax_wmt_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def example_config(models: ModuleType, model: TransformerConfig, *, decode: bool = False,
                   max_len: int = 256) -> Any:
    """The example's TransformerConfig with our model's sizes: one shared table, logits through it."""
    return models.TransformerConfig(
        vocab_size=model.vocab_size, output_vocab_size=model.vocab_size, share_embeddings=True,
        logits_via_embedding=True, dtype=model.compute_dtype, emb_dim=model.d_model, num_heads=model.num_heads,
        num_layers=model.num_layers, qkv_dim=model.d_model, mlp_dim=model.d_ff, max_len=max_len,
        dropout_rate=model.dropout_rate, attention_dropout_rate=model.dropout_rate, deterministic=decode,
        decode=decode)


def _cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array, smoothing: float) -> jax.Array:
    """The example's compute_weighted_cross_entropy (summed), as its train.py writes it."""
    vocab = logits.shape[-1]
    confidence = 1.0 - smoothing
    low = (1.0 - confidence) / (vocab - 1)
    constant = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))
    soft = jax.nn.one_hot(targets, vocab) * (confidence - low) + low
    loss = -jnp.sum(soft * jax.nn.log_softmax(logits), axis=-1) - constant
    return (loss * weights).sum()


def train_step_function(models: ModuleType, config: Any, smoothing: float, warmup: int, d_model: int):
    """(init(rng, batch) -> (params, opt_state), step(params, opt_state, batch, rng) -> (params, opt_state, metrics))."""
    transformer = models.Transformer(config)
    optimizer = paper_optimizer(paper_learning_rate(d_model, warmup))
    keys = ("inputs_position", "targets_position", "inputs_segmentation", "targets_segmentation")

    def init(rng: jax.Array, batch: dict[str, jax.Array]) -> tuple[Any, Any]:
        params = transformer.init(rng, batch["inputs"], batch["targets"])["params"]
        return params, optimizer.init(params)

    def step(params: Any, opt_state: Any, batch: dict[str, jax.Array], rng: jax.Array):
        weights = jnp.where(batch["targets"] > 0, 1, 0).astype(jnp.float32)

        def loss_fn(params: Any) -> tuple[jax.Array, jax.Array]:
            logits = transformer.apply({"params": params}, batch["inputs"], batch["targets"],
                                       **{k + "s" if k.endswith("position") else k: batch[k] for k in keys}, rngs={"dropout": rng})
            return _cross_entropy(logits, batch["targets"], weights, smoothing) / weights.sum(), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        accuracy = ((jnp.argmax(logits, -1) == batch["targets"]) * weights).sum()
        return params, opt_state, {"loss": loss, "accuracy": accuracy, "denominator": weights.sum()}

    return init, step


def abstract_batch(rows: int, width: int, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """A packed batch's shapes (ids, positions, segment ids of both sides), split over the mesh like ours."""
    sharding = batch_sharding(mesh)
    names = ("inputs", "targets", "inputs_position", "targets_position", "inputs_segmentation",
             "targets_segmentation")
    return {name: jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=sharding) for name in names}


def lower_train_step(models: ModuleType, model: TransformerConfig, mesh: Mesh, rows: int, width: int,
                     smoothing: float = 0.1, warmup: int = 4000) -> Any:
    """The example's train step lowered for `mesh` at `rows` x `width`: parameters and Adam state replicated
    (the example's data parallelism) and donated, the batch split over the devices."""
    init, step = train_step_function(models, example_config(models, model, max_len=width), smoothing, warmup,
                                     model.d_model)
    batch = abstract_batch(rows, width, mesh)
    local = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    params, opt_state = jax.eval_shape(init, jax.random.key(0), local)
    replicated = NamedSharding(mesh, PartitionSpec())

    def placed(tree: Any) -> Any:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree)

    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    jitted = jax.jit(step, donate_argnums=(0, 1))
    return jitted.lower(placed(params), placed(opt_state), batch, rng)


def lower_search(checkout: str, model: TransformerConfig, mesh: Mesh, rows: int, width: int, extra: int = 50,
                 beam_size: int = 4, alpha: float = 0.6, eos_id: int | None = None) -> Any:
    """The example's beam search (train.py's predict_step with decode.py's beam_search: its key/value cache in
    the compute dtype) lowered for `mesh`: `rows` sentences of `width` source tokens split over the devices,
    outputs up to `width + extra` tokens, parameters replicated. `eos_id` (default: the example's) -1 makes
    every search run to its full length (timings on random parameters)."""
    models, decode = load_example(checkout, "models"), load_example(checkout, "decode")
    max_decode_len = width + extra
    decoder_config = example_config(models, model, decode=True, max_len=max(width, max_decode_len))
    encoder_config = decoder_config.replace(decode=False)
    params = jax.eval_shape(lambda: models.Transformer(encoder_config).init(
        jax.random.key(0), jnp.ones((1, width), jnp.int32), jnp.ones((1, width), jnp.int32))["params"])
    cache = jax.eval_shape(lambda: models.Transformer(decoder_config).init(
        jax.random.key(0), jnp.ones((rows, width), jnp.int32), jnp.ones((rows, max_decode_len), jnp.int32))["cache"])

    def predict(params: Any, inputs: jax.Array) -> jax.Array:
        local = inputs.shape[0]  # under jit: the global rows; the cache is laid out for them
        encoded = decode.flat_batch_beam_expand(
            models.Transformer(encoder_config).apply({"params": params}, inputs, method=models.Transformer.encode),
            beam_size)
        raw_inputs = decode.flat_batch_beam_expand(inputs, beam_size)

        def tokens_ids_to_logits(flat_ids, flat_cache):
            logits, new_vars = models.Transformer(decoder_config).apply(
                {"params": params, "cache": flat_cache}, encoded, raw_inputs, flat_ids, mutable=["cache"],
                method=models.Transformer.decode)
            return logits.squeeze(axis=1), new_vars["cache"]

        zeros = jax.tree.map(lambda x: jnp.zeros((local,) + x.shape[1:] if x.ndim else x.shape, x.dtype), cache)
        sequences, _ = decode.beam_search(inputs, zeros, tokens_ids_to_logits, beam_size=beam_size, alpha=alpha,
                                          eos_id=decode.EOS_ID if eos_id is None else eos_id,
                                          max_decode_len=max_decode_len)
        return sequences[:, -1, 1:]

    replicated = NamedSharding(mesh, PartitionSpec())
    placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), params)
    inputs = jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=batch_sharding(mesh))
    return jax.jit(predict).lower(placed, inputs)
