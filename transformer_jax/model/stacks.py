"""The encoder and decoder stacks (paper section 3.1, figure 1): embeddings, positions and N layers each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from transformer_jax.base.sharding import BATCH_AXES, FSDP_AXIS
from transformer_jax.model.attention import DECODE_STEP, ENCODER_CACHE, HYPOTHESIS_CACHE, SLOT_CACHE
from transformer_jax.model.attention_kernels import SegmentedMask
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.embeddings import OutputProjection, TokenEmbedding
from transformer_jax.model.layers import DecoderLayer, EncoderLayer, layer_norm
from transformer_jax.model.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)
from transformer_jax.model.positional_encoding import PositionalEncoding


def token_embedding(config: TransformerConfig, name: str) -> TokenEmbedding:
    """A TokenEmbedding configured from `config`."""
    return TokenEmbedding(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        name=name,
    )


def default_positions(tokens: jax.Array) -> jax.Array:
    """[B, T] positions 0..T-1 for unpacked rows."""
    return jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)


def _segment_mask_or_none(q_segments: jax.Array | None, kv_segments: jax.Array | None) -> jax.Array | None:
    if q_segments is None or kv_segments is None:
        return None
    return segment_mask(q_segments, kv_segments)


class EncoderStackInputs(NamedTuple):
    """What every encoder layer of a stack receives besides the carried activations."""

    mask: jax.Array | None  # [B, 1, S, S] self-attention mask


class DecoderStackInputs(NamedTuple):
    """What every decoder layer of a stack receives besides the carried activations."""

    encoded_BxSxD: jax.Array
    self_mask: jax.Array | None  # [B, 1, T, T]; None while stepping (the cache masks)
    cross_mask: jax.Array | None  # [B, 1, T, S]
    beam_slots: jax.Array | None = None  # [B, N, L] while decoding: see Decoder


class StackedEncoderLayer(EncoderLayer):
    """An EncoderLayer as one step of a stack: (x, inputs) -> (x, None), the form `nn.scan` needs.

    A subclass, so its parameters are named exactly as an EncoderLayer's.
    """

    deterministic: bool = True

    def __call__(  # type: ignore[override]
        self, x_BxSxD: jax.Array, inputs: EncoderStackInputs
    ) -> tuple[jax.Array, None]:
        """[B, S, d_model] -> ([B, S, d_model], None)."""
        return super().__call__(x_BxSxD, inputs.mask, self.deterministic), None


class StackedDecoderLayer(DecoderLayer):
    """A DecoderLayer as one step of a stack: (y, inputs) -> (y, None), the form `nn.scan` needs.

    A subclass, so its parameters are named exactly as a DecoderLayer's.
    """

    deterministic: bool = True

    def __call__(  # type: ignore[override]
        self, y_BxTxD: jax.Array, inputs: DecoderStackInputs
    ) -> tuple[jax.Array, None]:
        """[B, T, d_model] -> ([B, T, d_model], None)."""
        y_BxTxD = super().__call__(
            y_BxTxD, inputs.encoded_BxSxD, inputs.self_mask, inputs.cross_mask, self.deterministic,
            inputs.beam_slots)
        return y_BxTxD, None


_REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def layer_stack(
    config: TransformerConfig, layer: type[StackedEncoderLayer | StackedDecoderLayer], **attributes: Any
) -> list[nn.Module] | nn.Module:
    """The N layers of a stack, rematerialized and/or scanned as `config` asks.

    `attributes` (e.g. `deterministic`) go to every layer. Returns a list of N layers, or one scanned
    module when `config.scan_layers` (its leading parameter axis is the layer, named `layers`).
    """
    if config.remat != "none":
        layer = nn.remat(layer, policy=_REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers)
    if not config.scan_layers:
        return [layer(config, name=f"layer_{i}", **attributes) for i in range(config.num_layers)]
    scanned = nn.scan(
        layer,
        # Every collection a layer has gets a leading layer axis (decoding state included).
        variable_axes={
            "params": 0, "intermediates": 0, HYPOTHESIS_CACHE: 0, SLOT_CACHE: 0, ENCODER_CACHE: 0,
            DECODE_STEP: 0,
        },
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,),
        length=config.num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    return scanned(config, name="layers", **attributes)


def rows_split(x: jax.Array) -> jax.Array:
    """`x` kept split by rows over the context mesh's batch axes when that mesh shards the parameters (fsdp).

    Without it, XLA's partitioner follows the parameters' sharding (d_model split over fsdp) into the
    activations and splits them along d_model too, moving activations between chips at every matmul; kept
    split by rows, each matmul gathers its (sharded) weights instead, as fully sharded data parallelism
    intends. A no-op without a context mesh, on a mesh without fsdp, for rows the mesh does not divide, and
    inside `shard_map` (manual axes: each device holds its own rows already).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if (mesh.empty or FSDP_AXIS not in mesh.axis_names or mesh.shape[FSDP_AXIS] == 1 or x.shape[0] % mesh.size
            or any(kind != jax.sharding.AxisType.Auto for kind in mesh.axis_types)):
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(BATCH_AXES))


def run_stack(
    stack: list[nn.Module] | nn.Module, x: jax.Array, inputs: EncoderStackInputs | DecoderStackInputs
) -> jax.Array:
    """Apply the layers from `layer_stack` in order to `x`, each also given the shared `inputs`; between
    layers the activations stay split by rows (`rows_split`)."""
    x = rows_split(x)
    if isinstance(stack, list):
        for layer in stack:
            x, _ = layer(x, inputs)
            x = rows_split(x)
        return x
    return rows_split(stack(x, inputs)[0])


def scanned_layout(params: Any) -> Any:
    """Parameters of an unscanned model (`layer_0`..`layer_{N-1}`) in the scan_layers=True layout.

    Works on plain (unboxed) arrays; logical-axis boxes are dropped.
    """
    params = nn.meta.unbox(params)
    if not isinstance(params, Mapping):
        return params
    names = sorted((k for k in params if k.startswith("layer_")), key=lambda k: int(k.split("_")[1]))
    out = {k: scanned_layout(v) for k, v in params.items() if k not in names}
    if names:
        out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *(params[k] for k in names))
    return out


def unscanned_layout(params: Any) -> Any:
    """Parameters of a scan_layers=True model in the per-layer (`layer_i`) layout (unboxed)."""
    params = nn.meta.unbox(params)
    if not isinstance(params, Mapping):
        return params
    out = {k: unscanned_layout(v) for k, v in params.items() if k != "layers"}
    if "layers" in params:
        num_layers = jax.tree.leaves(params["layers"])[0].shape[0]
        for i in range(num_layers):
            out[f"layer_{i}"] = jax.tree.map(lambda x: x[i], params["layers"])
    return out


class Encoder(nn.Module):
    """Embedding + positions, dropout, N encoder layers (and a final LayerNorm when pre-LN).

    `shared_embedding` lets a parent share one TokenEmbedding with the decoder; without it the
    encoder owns its table.
    """

    config: TransformerConfig
    shared_embedding: TokenEmbedding | None = None

    @nn.compact
    def __call__(
        self,
        src_tokens: jax.Array,
        src_positions: jax.Array | None = None,
        src_segments: jax.Array | None = None,
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        """[B, S] source ids (0 = padding) -> [B, S, d_model] encoder output."""
        cfg = self.config
        embed = self.shared_embedding if self.shared_embedding is not None else token_embedding(cfg, "embedding")
        positions = default_positions(src_tokens) if src_positions is None else src_positions
        x_BxSxD = embed(src_tokens) + PositionalEncoding(
            cfg.d_model, cfg.max_len, cfg.positional_encoding, cfg.compute_dtype,
            cfg.params_dtype, name="positional_encoding",
        )(positions)
        x_BxSxD = Dropout(cfg.dropout_rate)(x_BxSxD, deterministic=deterministic)
        # Segment ids, not a [B, 1, S, S] array: each attention takes them to its kernel or makes the array.
        mask = SegmentedMask.of(src_tokens, src_tokens, src_segments, src_segments)
        layers = layer_stack(cfg, StackedEncoderLayer, deterministic=deterministic)
        x_BxSxD = run_stack(layers, x_BxSxD, EncoderStackInputs(mask))
        if cfg.norm_position == "pre":
            x_BxSxD = layer_norm(cfg, "final_norm")(x_BxSxD)
        return x_BxSxD


class Decoder(nn.Module):
    """Embedding + positions, dropout, N decoder layers, (final LayerNorm,) pre-softmax projection.

    With `decode=True` it runs one target position per call against its decoding state (the
    `DECODING_COLLECTIONS`, its own position in 'decode_step', the hypotheses' beam slot table in
    'cache'); the call that creates that state (given the whole, possibly dummy, target; B*N rows
    against B encoded sentences) fixes the cache length and the number of beams N.
    """

    config: TransformerConfig
    shared_embedding: TokenEmbedding | None = None
    decode: bool = False

    @nn.compact
    def __call__(
        self,
        encoded_BxSxD: jax.Array,
        src_tokens: jax.Array,
        tgt_in: jax.Array,
        tgt_positions: jax.Array | None = None,
        src_segments: jax.Array | None = None,
        tgt_segments: jax.Array | None = None,
        *,
        deterministic: bool = True,
        hidden_only: bool = False,
    ) -> jax.Array:
        """[B, T] shifted-right target ids -> [B, T, vocab] float32 logits.

        With `hidden_only`, the [B, T, d_model] input of the pre-softmax projection instead (its weights:
        `model.transformer.output_weights`), for a loss that projects a chunk at a time.
        """
        cfg = self.config
        embed = self.shared_embedding if self.shared_embedding is not None else token_embedding(cfg, "embedding")
        stepping = self.decode and self.has_variable(DECODE_STEP, "position")
        beam_slots = None
        if self.decode:
            position = self.variable(DECODE_STEP, "position", lambda: jnp.array(0, jnp.int32))
            if stepping and tgt_positions is None:
                tgt_positions = jnp.broadcast_to(position.value, tgt_in.shape)
            beam_slots = self._beam_slots(tgt_in, encoded_BxSxD.shape[0], position.value, stepping)
            if stepping:
                position.value = position.value + tgt_in.shape[1]
        positions = default_positions(tgt_in) if tgt_positions is None else tgt_positions
        y_BxTxD = embed(tgt_in) + PositionalEncoding(
            cfg.d_model, cfg.max_len, cfg.positional_encoding, cfg.compute_dtype,
            cfg.params_dtype, name="positional_encoding",
        )(positions)
        y_BxTxD = Dropout(cfg.dropout_rate)(y_BxTxD, deterministic=deterministic)

        if self.decode:  # the decoding state folds beams into the boolean masks
            self_mask, cross_mask = self._decoding_masks(src_tokens, tgt_in, src_segments, tgt_segments, stepping)
        else:
            self_mask = SegmentedMask.of(tgt_in, tgt_in, tgt_segments, tgt_segments, causal=True)
            cross_mask = SegmentedMask.of(tgt_in, src_tokens, tgt_segments, src_segments)
        layers = layer_stack(cfg, StackedDecoderLayer, decode=self.decode, deterministic=deterministic)
        y_BxTxD = run_stack(layers, y_BxTxD, DecoderStackInputs(encoded_BxSxD, self_mask, cross_mask, beam_slots))
        if cfg.norm_position == "pre":
            y_BxTxD = layer_norm(cfg, "final_norm")(y_BxTxD)
        if hidden_only:
            return y_BxTxD
        if cfg.tie_output_embedding and cfg.output_bias:
            bias_V = self.param("output_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                                (cfg.vocab_size,), cfg.params_dtype)
            return embed.attend(y_BxTxD) + bias_V.astype(jnp.float32)
        if cfg.tie_output_embedding:
            return embed.attend(y_BxTxD)
        return OutputProjection(
            cfg.vocab_size, cfg.compute_dtype, cfg.params_dtype, name="output_projection"
        )(y_BxTxD)

    @staticmethod
    def _decoding_masks(src_tokens: jax.Array, tgt_in: jax.Array, src_segments: jax.Array | None,
                        tgt_segments: jax.Array | None, stepping: bool) -> tuple[jax.Array | None, jax.Array | None]:
        """The boolean self-attention ([B, 1, T, T]; None while stepping: the self-attention cache itself hides
        positions not yet written) and cross-attention ([B, 1, T, S]) masks of a decoding call."""
        self_mask = None if stepping else combine_masks(
            padding_mask(tgt_in, tgt_in),
            causal_mask(tgt_in.shape[1]),
            _segment_mask_or_none(tgt_segments, tgt_segments),
        )
        cross_mask = combine_masks(
            padding_mask(tgt_in, src_tokens), _segment_mask_or_none(tgt_segments, src_segments)
        )
        return self_mask, cross_mask

    def _beam_slots(self, tgt_in: jax.Array, batch: int, position: jax.Array, stepping: bool) -> jax.Array:
        """[B, N, L] beam slot holding each position's self-attention keys/values, per hypothesis.

        The [B*N, L] table is the only per-hypothesis decoding state (collection 'cache'): beam search
        reorders its rows, so each hypothesis inherits its parent's history, and this step writes
        each hypothesis' own slot (n of row b*N + n) at the current position.
        """
        batch_beams = tgt_in.shape[0]
        beams = batch_beams // batch
        slots = self.variable(
            HYPOTHESIS_CACHE, "beam_slots", jnp.zeros, (batch_beams, tgt_in.shape[1]), jnp.int32)
        if stepping:
            own_BNx1 = (jnp.arange(batch_beams, dtype=jnp.int32) % beams)[:, None]
            slots.value = jax.lax.dynamic_update_slice_in_dim(slots.value, own_BNx1, position, axis=1)
        return slots.value.reshape(batch, beams, -1)
