"""Values inside a Transformer worth looking at: its attention weights and its positional encodings.

Shapes: L layers, H heads, T target (decoder input) length, S source length, D d_model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from transformer_jax.errors import ConfigError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.positional_encoding import sinusoidal_encoding
from transformer_jax.model.transformer import Transformer

# kind -> (stack, sublayer name) of the MultiHeadAttention modules that sow the weights.
ATTENTION_KINDS: dict[str, tuple[str, str]] = {
    "encoder_self_attention": ("encoder", "self_attention"),
    "decoder_self_attention": ("decoder", "self_attention"),
    "encoder_decoder_attention": ("decoder", "cross_attention"),
}
# The paper's names, for figure titles.
ATTENTION_TITLES: dict[str, str] = {
    "encoder_self_attention": "encoder self-attention",
    "decoder_self_attention": "decoder masked self-attention",
    "encoder_decoder_attention": "encoder-decoder attention",
}


def attention_maps(
    config: TransformerConfig, params: Any, source_ids: np.ndarray, decoder_input_ids: np.ndarray
) -> dict[str, np.ndarray]:
    """The softmax weights of every attention kind for one sentence pair, float32 [L, H, T|S, S|T].

    `source_ids` [S] are the encoder input (ending with EOS, no padding); `decoder_input_ids` [T] the
    target shifted right (starting with BOS). The pair is run teacher-forced, without dropout, on the
    einsum attention backend, which sows its weights (the parameters are the same for every backend).
    Encoder self-attention is [L, H, S, S], decoder self-attention [L, H, T, T], encoder-decoder
    attention [L, H, T, S]; rows are queries, columns keys.
    """
    viewing = config.replace(attention_backend="einsum", dropout_rate=0.0, attention_dropout_rate=0.0)
    src_1xS = jnp.asarray(source_ids, jnp.int32)[None]
    tgt_1xT = jnp.asarray(decoder_input_ids, jnp.int32)[None]
    _, state = Transformer(viewing).apply({"params": params}, src_1xS, tgt_1xT, mutable=["intermediates"])
    return collect_attention(state["intermediates"])


def collect_attention(intermediates: Any) -> dict[str, np.ndarray]:
    """The sown 'attention_weights' of the first sentence, stacked per kind into [L, H, T, S].

    Each layer is a submodule `layer_<i>` of its stack, or (config.scan_layers) one scanned
    submodule `layers` that sows all of them at once with a leading layer axis.
    """
    flat = traverse_util.flatten_dict(intermediates)
    maps = {}
    for kind, (stack, sublayer) in ATTENTION_KINDS.items():
        per_layer: dict[int, np.ndarray] = {}
        for path, sown in flat.items():
            if path[0] != stack or path[-2:] != (sublayer, "attention_weights"):
                continue
            weights = np.asarray(sown[-1])  # the last call's [B, H, T, S] ([L, B, H, T, S] if scanned)
            if path[1] == "layers":
                per_layer.update(enumerate(weights[:, 0]))
            else:
                per_layer[int(path[1].removeprefix("layer_"))] = weights[0]
        if not per_layer:
            raise ConfigError(f"the model sowed no {stack} {sublayer} weights; use attention_backend='einsum'")
        maps[kind] = np.stack([per_layer[i] for i in sorted(per_layer)])
    return maps


def positional_encoding_matrix(
    config: TransformerConfig, params: Any = None, length: int | None = None
) -> np.ndarray:
    """The [positions, D] vectors added to the embeddings: sinusoidal, or the encoder's learned table.

    `length` defaults to config.max_len. Learned positions need the trained `params`.
    """
    length = config.max_len if length is None else min(length, config.max_len)
    if config.positional_encoding == "sinusoidal":
        return np.asarray(sinusoidal_encoding(jnp.arange(length), config.d_model))
    if params is None:
        raise ValueError("learned positional encodings need the trained params")
    table = params["encoder"]["positional_encoding"]["position_embedding"]
    return np.asarray(jax.device_get(getattr(table, "value", table)), np.float32)[:length]
