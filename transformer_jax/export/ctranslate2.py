"""A trained model as a CTranslate2 model directory: our parameters written through CTranslate2's spec API.

CTranslate2 (https://opennmt.net/CTranslate2) runs encoder-decoder Transformers in C++ on CPU and GPU,
with int8/float16 weights. `export_ctranslate2` fills a `ctranslate2.specs.TransformerSpec` with our
parameters and saves it, so `ctranslate2.Translator(directory)` translates as our model does:

  * post-LN and pre-LN (the pre-LN stacks' final LayerNorm), the feed-forward activation, LayerNorm epsilon;
  * the output bias (tied projection with `output_bias`, or the untied projection's);
  * token embeddings scaled by sqrt(d_model); one table for source, target and (when tied) the output;
  * positions: CTranslate2's built-in sinusoidal table is [sin..., cos...] (halves), ours interleaves
    (dimension 2i is sin, 2i+1 cos), so our table (or the learned one) is written out explicitly as the
    spec's position encodings, max_len rows;
  * the key projection has no bias in our attention (the softmax cancels it): zeros are written;
  * PAD and BOS are never generated (as in our decoding): their output bias is a large negative;
  * the source gets EOS appended (`add_source_eos`) and decoding starts from BOS, as ours does.

ctranslate2 is imported here only, so `import transformer_jax` does not need it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import numpy as np

from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_jax.errors import ConfigError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.positional_encoding import sinusoidal_encoding
from transformer_jax.model.stacks import unscanned_layout
from transformer_jax.base.files import directory_written_whole, is_local
from transformer_jax.evaluation.outputs import file_in_the_way

# Added to the output logits of tokens our decoding never emits (PAD, BOS). Finite, so float16
# compute stays finite; exp() of it underflows to 0 like our -inf mask.
NEVER_EMITTED_BIAS = -1e4


def import_ctranslate2() -> Any:
    """The ctranslate2 module, or a ConfigError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(
            "exporting to CTranslate2 needs the ctranslate2 package; install it with "
            "pip install 'transformer-jax[export]' (or pip install ctranslate2)"
        ) from None
    return ctranslate2


def _array(x: Any) -> np.ndarray:
    return np.asarray(x, np.float32)


def _linear(spec: Any, kernel_DxO: np.ndarray, bias_O: np.ndarray | None) -> None:
    """A CTranslate2 linear layer: weight [out, in] (ours are [in, out]), bias [out]."""
    spec.weight = np.ascontiguousarray(_array(kernel_DxO).T)
    spec.bias = _array(bias_O) if bias_O is not None else np.zeros(kernel_DxO.shape[1], np.float32)


def _layer_norm(spec: Any, params: Mapping[str, Any]) -> None:
    spec.gamma = _array(params["scale"])
    spec.beta = _array(params["bias"])


def _projection(params: Mapping[str, Any], d_model: int) -> tuple[np.ndarray, np.ndarray]:
    """A [d_model, H, K] DenseGeneral as ([d_model, H*K] kernel, [H*K] bias; zeros without one)."""
    kernel = _array(params["kernel"]).reshape(d_model, -1)
    bias = _array(params["bias"]).reshape(-1) if "bias" in params else np.zeros(kernel.shape[1], np.float32)
    return kernel, bias


def _attention(spec: Any, params: Mapping[str, Any], d_model: int, self_attention: bool) -> None:
    """Self-attention: linear[0] = fused Q|K|V; cross-attention: linear[0] = Q, linear[1] = fused K|V."""
    query, key, value = (_projection(params[name], d_model) for name in ("query", "key", "value"))
    if self_attention:
        _linear(spec.linear[0], np.concatenate([query[0], key[0], value[0]], 1),
                np.concatenate([query[1], key[1], value[1]]))
    else:
        _linear(spec.linear[0], *query)
        _linear(spec.linear[1], np.concatenate([key[0], value[0]], 1), np.concatenate([key[1], value[1]]))
    out = params["out"]
    _linear(spec.linear[-1], _array(out["kernel"]).reshape(-1, d_model), out["bias"])


def _feed_forward(spec: Any, params: Mapping[str, Any], norm: Mapping[str, Any]) -> None:
    _layer_norm(spec.layer_norm, norm)
    _linear(spec.linear_0, params["inner"]["kernel"], params["inner"]["bias"])
    _linear(spec.linear_1, params["outer"]["kernel"], params["outer"]["bias"])


def _positions(config: TransformerConfig, stack: Mapping[str, Any]) -> np.ndarray:
    """[max_len, d_model]: our interleaved sinusoidal table, or the learned one."""
    if config.positional_encoding == "learned":
        return _array(stack["positional_encoding"]["position_embedding"])
    return _array(sinusoidal_encoding(np.arange(config.max_len), config.d_model))


def _fill_encoder(spec: Any, config: TransformerConfig, stack: Mapping[str, Any], embedding: np.ndarray) -> None:
    spec.embeddings[0].weight = embedding
    spec.scale_embeddings = True  # multiply by sqrt(d_model), as TokenEmbedding does
    spec.position_encodings.encodings = _positions(config, stack)
    for i, layer_spec in enumerate(spec.layer):
        layer = stack[f"layer_{i}"]
        _attention(layer_spec.self_attention, layer["self_attention"], config.d_model, True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer["self_attention_norm"])
        _feed_forward(layer_spec.ffn, layer["feed_forward"], layer["feed_forward_norm"])
    if config.norm_position == "pre":
        _layer_norm(spec.layer_norm, stack["final_norm"])


def _fill_decoder(spec: Any, config: TransformerConfig, stack: Mapping[str, Any], embedding: np.ndarray) -> None:
    spec.embeddings.weight = embedding
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _positions(config, stack)
    for i, layer_spec in enumerate(spec.layer):
        layer = stack[f"layer_{i}"]
        _attention(layer_spec.self_attention, layer["self_attention"], config.d_model, True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer["self_attention_norm"])
        _attention(layer_spec.attention, layer["cross_attention"], config.d_model, False)
        _layer_norm(layer_spec.attention.layer_norm, layer["cross_attention_norm"])
        _feed_forward(layer_spec.ffn, layer["feed_forward"], layer["feed_forward_norm"])
    if config.norm_position == "pre":
        _layer_norm(spec.layer_norm, stack["final_norm"])
    if config.tie_output_embedding:
        kernel_DxV = embedding.T
        bias_V = _array(stack["output_bias"]).copy() if config.output_bias else np.zeros(config.vocab_size, np.float32)
    else:
        projection = stack["output_projection"]
        kernel_DxV, bias_V = _array(projection["kernel"]), _array(projection["bias"]).copy()
    bias_V[[PAD_ID, BOS_ID]] = NEVER_EMITTED_BIAS
    _linear(spec.projection, kernel_DxV, bias_V)


def transformer_spec(params: Any, config: TransformerConfig, vocabulary: Sequence[str]) -> Any:
    """A validated `ctranslate2.specs.TransformerSpec` holding `params` (scanned or not, boxed or not).

    `vocabulary[i]` is the piece of token id i (our ids: pad 0, unk 1, bos 2, eos 3).
    """
    import_ctranslate2()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as specs

    if len(vocabulary) != config.vocab_size:
        raise ConfigError(f"the vocabulary has {len(vocabulary)} pieces but the model {config.vocab_size} "
                          "embeddings; export with the run's own tokenizer")
    params = unscanned_layout(nn.meta.unbox(params))
    pre_norm = config.norm_position == "pre"
    activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
                  "gelu": common_spec.Activation.GELU}[config.activation]
    encoder = specs.TransformerEncoderSpec(config.num_layers, config.num_heads, pre_norm=pre_norm, activation=activation)
    decoder = specs.TransformerDecoderSpec(config.num_layers, config.num_heads, pre_norm=pre_norm, activation=activation)
    spec = specs.TransformerSpec(encoder, decoder)
    if config.share_embeddings:
        source_embedding = target_embedding = _array(params["shared_embedding"]["embedding"])
    else:
        source_embedding = _array(params["encoder"]["embedding"]["embedding"])
        target_embedding = _array(params["decoder"]["embedding"]["embedding"])
    _fill_encoder(spec.encoder, config, params["encoder"], source_embedding)
    _fill_decoder(spec.decoder, config, params["decoder"], target_embedding)
    tokens = list(vocabulary)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (
        tokens[UNK_ID], tokens[BOS_ID], tokens[EOS_ID])
    spec.config.decoder_start_token = tokens[BOS_ID]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.validate()
    return spec


def check_output_directory(output_dir: str) -> None:
    """Fail with a ConfigError unless `output_dir` is a local path, absent or an empty directory, that can be made."""
    if not is_local(output_dir):
        raise ConfigError(f"export directory {output_dir} must be on this machine (CTranslate2 loads local "
                          "directories); export locally, then copy it")
    blocking = file_in_the_way(os.path.dirname(os.path.abspath(output_dir)))
    if blocking is not None:
        raise ConfigError(f"cannot write export directory {output_dir} (Not a directory: {blocking} is a file); "
                          "choose another directory")
    if os.path.isfile(output_dir) or (os.path.isdir(output_dir) and os.listdir(output_dir)):
        raise ConfigError(f"export directory {output_dir} already exists and is not empty; "
                          "choose a new directory or remove it")


def export_ctranslate2(params: Any, config: TransformerConfig, vocabulary: Sequence[str], output_dir: str, *,
                       quantization: str | None = None, extra_files: Mapping[str, bytes] | None = None) -> str:
    """Write the CTranslate2 model of `params` to the local `output_dir` (created; must be absent or empty).

    `quantization` (e.g. "int8", "float16") stores the weights so; by default float32, which any
    compute_type can load. `extra_files` ({file name: content}, e.g. the SentencePiece model) are
    written beside the model. Returns `output_dir`.

    The model is written into a temporary folder beside `output_dir`, renamed to it when complete: a
    failure (a full disk) leaves no `output_dir` that a second try would refuse as not empty, and is
    raised as the OSError naming `output_dir`.
    """
    check_output_directory(output_dir)
    spec = transformer_spec(params, config, vocabulary)
    if quantization is not None:
        spec.optimize(quantization=quantization)
    with directory_written_whole(output_dir) as staging:
        spec.save(staging)
        for name, content in (extra_files or {}).items():
            with open(os.path.join(staging, name), "wb") as f:
                f.write(content)
    return os.path.normpath(output_dir)
