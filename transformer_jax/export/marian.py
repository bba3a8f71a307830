"""Hugging Face Marian (OPUS-MT) checkpoints in and out: the same network in our parameters and in theirs.

Marian's Transformer is the paper's post-LN encoder-decoder. What differs, and how each is made exact:

  * the feed-forward activation (OPUS-MT: swish): `model.activation`;
  * `final_logits_bias` on the tied output projection: `model.output_bias` (an untied projection has a bias);
  * sinusoidal positions laid out as [sin..., cos...] where ours interleave (dimension 2i sin, 2i+1 cos):
    the same network up to a fixed permutation of the model dimension, applied to every d_model axis of
    every weight (`OURS_FROM_HALVES`); LayerNorm, residuals and attention do not mind the order;
  * a bias on the key projection: it adds q.b to every logit of a query, which the softmax cancels, so it is
    dropped on import and written as zeros on export;
  * special ids (EOS 0, UNK 1, PAD last, decoding from PAD): embedding and output rows are reordered to our
    ids (data/marian_vocabulary.py: PAD 0, UNK 1, BOS 2 = Marian's decoder start, EOS 3, then the rest);
  * LayerNorm epsilon 1e-5 (PyTorch's): `model.layer_norm_epsilon`.

`marian_to_ours` and `ours_to_marian` convert parameter dicts (NumPy, Hugging Face names); reading and writing
whole checkpoint directories, and a directory's files, are in export/hf_directory.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}  # Hugging Face's -> ours
_LAYER_NORMS = {"self_attn_layer_norm": "self_attention_norm", "encoder_attn_layer_norm": "cross_attention_norm",
                "final_layer_norm": "feed_forward_norm"}
_ATTENTIONS = {"self_attn": "self_attention", "encoder_attn": "cross_attention"}


def ours_from_halves(d_model: int) -> np.ndarray:
    """perm with ours[..., j] = theirs[..., perm[j]]: dimension 2i <- i (sin), 2i+1 <- d/2 + i (cos)."""
    half = np.arange(d_model // 2)
    return np.stack([half, half + d_model // 2], axis=1).reshape(-1)


def embedding_tables(tensors: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The (source, target) embedding tables of a Marian state dict (names without "model."): the encoder's and
    decoder's own where saved (transformers keeps them apart when tie_word_embeddings is false), else `shared`."""
    return (_table(tensors, "encoder.embed_tokens.weight", "shared.weight"),
            _table(tensors, "decoder.embed_tokens.weight", "shared.weight"))


def model_config_of(hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> TransformerConfig:
    """Our TransformerConfig of a Marian `config.json` and state dict; a ConfigError naming what we cannot
    represent. The embeddings are shared when the source and target tables are one (equal)."""
    if hf.get("model_type") != "marian":
        raise ConfigError(f"config.json has model_type={hf.get('model_type')!r}, not 'marian'")
    unsupported = [
        (hf.get("encoder_layers") != hf.get("decoder_layers"), "different encoder and decoder depths"),
        (hf.get("encoder_ffn_dim") != hf.get("decoder_ffn_dim"), "different encoder and decoder d_ff"),
        (hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads"), "different head counts"),
        (not hf.get("scale_embedding", False), "scale_embedding=false (ours scale embeddings by sqrt(d_model))"),
        (hf.get("activation_function") not in ACTIVATIONS, f"activation_function={hf.get('activation_function')!r}"),
        (float(hf.get("activation_dropout") or 0) > 0, "activation_dropout > 0"),
        ((hf.get("decoder_vocab_size") or hf["vocab_size"]) != hf["vocab_size"],
         "source and target vocabularies of different sizes (decoder_vocab_size differs from vocab_size)"),
        (hf["d_model"] % 2, "an odd d_model"),
    ]
    reasons = [reason for failed, reason in unsupported if failed]
    if reasons:
        raise ConfigError(f"this Marian model has {', '.join(reasons)}, which transformer_jax does not support")
    return TransformerConfig(
        vocab_size=hf["vocab_size"] + (hf["decoder_start_token_id"] == hf["pad_token_id"]),
        num_layers=hf["encoder_layers"], d_model=hf["d_model"], d_ff=hf["encoder_ffn_dim"],
        num_heads=hf["encoder_attention_heads"], dropout_rate=float(hf.get("dropout", 0.1)),
        attention_dropout_rate=float(hf.get("attention_dropout", 0.0)), max_len=hf["max_position_embeddings"],
        share_embeddings=bool(np.array_equal(*embedding_tables(tensors))),
        tie_output_embedding=hf.get("tie_word_embeddings", True), output_bias=hf.get("tie_word_embeddings", True),
        activation=ACTIVATIONS[hf["activation_function"]], layer_norm_epsilon=1e-5, attention_backend="auto",
    )


def _linear_in(tensors: Mapping[str, np.ndarray], name: str, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A PyTorch Linear [out, in] reading the residual stream: our kernel [in (permuted), out] and bias."""
    return tensors[f"{name}.weight"].T[perm], tensors[f"{name}.bias"]


def _attention_in(tensors: Mapping[str, np.ndarray], name: str, heads: int, perm: np.ndarray) -> dict[str, Any]:
    d_model = perm.size
    head_dim = d_model // heads
    projections = {}
    for theirs, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
        kernel, bias = _linear_in(tensors, f"{name}.{theirs}", perm)
        projections[ours] = {"kernel": kernel.reshape(d_model, heads, head_dim)}
        if ours != "key":  # the softmax cancels a key bias
            projections[ours]["bias"] = bias.reshape(heads, head_dim)
    out = tensors[f"{name}.out_proj.weight"].T  # [H*K, D]
    projections["out"] = {"kernel": out[:, perm].reshape(heads, head_dim, d_model),
                          "bias": tensors[f"{name}.out_proj.bias"][perm]}
    return projections


def _layer_in(tensors: Mapping[str, np.ndarray], prefix: str, heads: int, perm: np.ndarray) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    for theirs, ours in _ATTENTIONS.items():
        if f"{prefix}.{theirs}.q_proj.weight" in tensors:
            layer[ours] = _attention_in(tensors, f"{prefix}.{theirs}", heads, perm)
    for theirs, ours in _LAYER_NORMS.items():
        if f"{prefix}.{theirs}.weight" in tensors:
            layer[ours] = {"scale": tensors[f"{prefix}.{theirs}.weight"][perm],
                           "bias": tensors[f"{prefix}.{theirs}.bias"][perm]}
    inner_kernel, inner_bias = _linear_in(tensors, f"{prefix}.fc1", perm)
    outer = tensors[f"{prefix}.fc2.weight"].T  # [F, D]
    layer["feed_forward"] = {"inner": {"kernel": inner_kernel, "bias": inner_bias},
                             "outer": {"kernel": outer[:, perm], "bias": tensors[f"{prefix}.fc2.bias"][perm]}}
    return layer


def _table(tensors: Mapping[str, np.ndarray], *names: str) -> np.ndarray:
    for name in names:
        if name in tensors:
            return tensors[name]
    raise ConfigError(f"the checkpoint holds none of {list(names)}; it is not a complete Marian model")


def marian_to_ours(tensors: Mapping[str, np.ndarray], config: TransformerConfig, rows: np.ndarray) -> dict[str, Any]:
    """Our (unscanned, unboxed) parameters of a Marian state dict `tensors` (Hugging Face names without "model.",
    as `read_marian` gives them).

    `rows[i]` is the Marian id of our id i (`marian_vocabulary.our_order`).
    """
    tensors = {name: np.asarray(value, np.float32) for name, value in tensors.items()}
    perm = ours_from_halves(config.d_model)
    heads, layers = config.num_heads, config.num_layers
    params: dict[str, Any] = {
        stack: {f"layer_{i}": _layer_in(tensors, f"{stack}.layers.{i}", heads, perm) for i in range(layers)}
        for stack in ("encoder", "decoder")
    }
    source, target = embedding_tables(tensors)
    if config.share_embeddings:
        params["shared_embedding"] = {"embedding": source[rows][:, perm]}
    else:
        params["encoder"]["embedding"] = {"embedding": source[rows][:, perm]}
        params["decoder"]["embedding"] = {"embedding": target[rows][:, perm]}
    bias = tensors.get("final_logits_bias", np.zeros((1, len(target)), np.float32)).reshape(-1)[rows]
    if config.tie_output_embedding:
        params["decoder"]["output_bias"] = bias
    else:
        params["decoder"]["output_projection"] = {"kernel": _table(tensors, "lm_head.weight")[rows][:, perm].T,
                                                  "bias": bias}
    return params


def _linear_out(kernel_DxO: np.ndarray, bias: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(kernel_DxO[inverse].T), bias


def _attention_out(params: Mapping[str, Any], name: str, inverse: np.ndarray) -> dict[str, np.ndarray]:
    d_model = inverse.size
    tensors = {}
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        kernel = np.asarray(params[ours]["kernel"], np.float32).reshape(d_model, -1)
        bias = np.asarray(params[ours]["bias"], np.float32).reshape(-1) if "bias" in params[ours] else \
            np.zeros(kernel.shape[1], np.float32)
        tensors[f"{name}.{theirs}.weight"], tensors[f"{name}.{theirs}.bias"] = _linear_out(kernel, bias, inverse)
    out = np.asarray(params["out"]["kernel"], np.float32).reshape(-1, d_model)  # [H*K, D]
    tensors[f"{name}.out_proj.weight"] = np.ascontiguousarray(out[:, inverse].T)
    tensors[f"{name}.out_proj.bias"] = np.asarray(params["out"]["bias"], np.float32)[inverse]
    return tensors


def _layer_out(layer: Mapping[str, Any], prefix: str, inverse: np.ndarray) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for theirs, ours in _ATTENTIONS.items():
        if ours in layer:
            tensors.update(_attention_out(layer[ours], f"{prefix}.{theirs}", inverse))
    for theirs, ours in _LAYER_NORMS.items():
        if ours in layer:
            tensors[f"{prefix}.{theirs}.weight"] = np.asarray(layer[ours]["scale"], np.float32)[inverse]
            tensors[f"{prefix}.{theirs}.bias"] = np.asarray(layer[ours]["bias"], np.float32)[inverse]
    feed_forward = layer["feed_forward"]
    inner = np.asarray(feed_forward["inner"]["kernel"], np.float32)
    tensors[f"{prefix}.fc1.weight"], tensors[f"{prefix}.fc1.bias"] = _linear_out(
        inner, np.asarray(feed_forward["inner"]["bias"], np.float32), inverse)
    outer = np.asarray(feed_forward["outer"]["kernel"], np.float32)  # [F, D]
    tensors[f"{prefix}.fc2.weight"] = np.ascontiguousarray(outer[:, inverse].T)
    tensors[f"{prefix}.fc2.bias"] = np.asarray(feed_forward["outer"]["bias"], np.float32)[inverse]
    return tensors


def exportable(config: TransformerConfig) -> None:
    """A ConfigError naming what of `config` a Marian model cannot hold."""
    reasons = [reason for failed, reason in (
        (config.norm_position != "post", "pre-LN layers (Marian's are post-LN)"),
        (config.positional_encoding != "sinusoidal", "learned positions (Marian's are sinusoidal)"),
        (config.d_model % 2, "an odd d_model"),
    ) if failed]
    if reasons:
        raise ConfigError(f"a Marian model cannot hold {', '.join(reasons)}; export to ctranslate2 instead")


def ours_to_marian(params: Mapping[str, Any], config: TransformerConfig, rows: np.ndarray) -> dict[str, np.ndarray]:
    """A Marian state dict (Hugging Face names, float32) of our unscanned, unboxed `params`.

    `rows[k]` is our id of Marian id k (`export_rows`); positions and key biases as in the module docstring.
    """
    exportable(config)
    inverse = np.argsort(ours_from_halves(config.d_model))
    tensors: dict[str, np.ndarray] = {}
    for stack in ("encoder", "decoder"):
        for i in range(config.num_layers):
            tensors.update(_layer_out(params[stack][f"layer_{i}"], f"model.{stack}.layers.{i}", inverse))

    def table(owner: Mapping[str, Any]) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(owner["embedding"], np.float32)[rows][:, inverse])

    if config.share_embeddings:
        target = tensors["model.shared.weight"] = table(params["shared_embedding"])
        # transformers (v5) ties the stacks' tables to `shared` only with tie_word_embeddings: write them too
        tensors["model.encoder.embed_tokens.weight"] = tensors["model.decoder.embed_tokens.weight"] = target
    else:
        tensors["model.encoder.embed_tokens.weight"] = table(params["encoder"]["embedding"])
        target = tensors["model.decoder.embed_tokens.weight"] = table(params["decoder"]["embedding"])
    decoder = params["decoder"]
    if config.tie_output_embedding:
        bias = np.asarray(decoder["output_bias"], np.float32) if config.output_bias else np.zeros(config.vocab_size)
        tensors["lm_head.weight"] = target
    else:
        projection = decoder["output_projection"]
        bias = np.asarray(projection["bias"], np.float32)
        tensors["lm_head.weight"] = np.ascontiguousarray(np.asarray(projection["kernel"], np.float32)[inverse][:, rows].T)
    tensors["final_logits_bias"] = np.asarray(bias, np.float32)[rows][None, :]
    return tensors


def export_rows(vocab_size: int) -> np.ndarray:
    """Our id of each Marian id when exporting: [EOS, UNK, 4, 5, ..., BOS] (Marian: EOS 0, UNK 1, pad last = our
    BOS, which is where Marian's decoding starts; our PAD row, never an input a mask lets through, is dropped)."""
    return np.concatenate([[EOS_ID, UNK_ID], np.arange(4, vocab_size), [BOS_ID]]).astype(np.int64)


assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)  # export_rows and our_order spell out this numbering


def hf_config_of(config: TransformerConfig, vocab_size: int) -> dict[str, Any]:
    """Marian's config.json for our `config` with `vocab_size` Marian ids (EOS 0, pad = decoder start = last)."""
    pad = vocab_size - 1
    activation = {"relu": "relu", "swish": "swish", "gelu": "gelu"}[config.activation]
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": vocab_size,
        "decoder_vocab_size": vocab_size, "d_model": config.d_model,
        "encoder_layers": config.num_layers, "decoder_layers": config.num_layers,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
        "activation_function": activation, "dropout": config.dropout_rate,
        "attention_dropout": config.attention_dropout_rate, "activation_dropout": 0.0,
        "max_position_embeddings": config.max_len, "scale_embedding": True, "normalize_embedding": False,
        "share_encoder_decoder_embeddings": config.share_embeddings, "tie_word_embeddings": config.tie_output_embedding,
        "pad_token_id": pad, "decoder_start_token_id": pad, "eos_token_id": 0, "forced_eos_token_id": 0,
        "bos_token_id": None, "is_encoder_decoder": True, "torch_dtype": "float32",
    }


def generation_config_of(hf_config: Mapping[str, Any], beam_size: int) -> dict[str, Any]:
    """generation_config.json: as OPUS-MT's, never emitting pad (ours never emit PAD or BOS)."""
    pad = hf_config["pad_token_id"]
    return {"bad_words_ids": [[pad]], "decoder_start_token_id": pad, "eos_token_id": 0, "forced_eos_token_id": 0,
            "pad_token_id": pad, "num_beams": beam_size, "max_length": hf_config["max_position_embeddings"]}
