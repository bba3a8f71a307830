"""TransformerConfig: the model's hyperparameters, with the paper's presets.

Each field is a setting declared once (`transformer_jax.base.declared`): its default, its meaning and its bound, or
the choices of its `Literal` type; the config's checks, the run config's `model` section and its reference read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

from transformer_jax.base import (
    FRACTION,
    KEYWORDS,
    POSITIVE,
    POSITIVE_INTEGER,
    Spelling,
    check_declared,
    declared,
    run_keys,
)
from transformer_jax.errors import ConfigError

NormPosition = Literal["post", "pre"]
PositionalEncodingKind = Literal["sinusoidal", "learned"]
# "einsum": softmax(QK^T/sqrt(d_k) + mask)V written out, compiled by XLA (runs everywhere, supports
# attention dropout). "fused": jax.nn.dot_product_attention's XLA implementation. "cudnn": cuDNN's flash
# attention through jax.nn.dot_product_attention (NVIDIA GPUs, 16-bit compute). "splash": JAX's Pallas
# splash attention kernel (TPUs; Pallas' interpreter elsewhere). "auto": splash on TPUs, "fused" on GPUs
# (attention_kernels.GPU_AUTO_BACKEND: cuDNN's once proven on a GPU), einsum on CPUs and wherever attention
# dropout is on (model/attention_kernels.py).
AttentionBackend = Literal["auto", "einsum", "fused", "cudnn", "splash"]
# What each layer keeps for the backward pass. "none": everything XLA wants; "full": only the layer's
# input (the layer is recomputed in the backward pass); "dots": the outputs of matmuls without batch
# dimensions (the projections), recomputing the rest (attention weights, activations, norms).
RematPolicy = Literal["none", "full", "dots"]
# The feed-forward networks' non-linearity: the paper's ReLU, or swish (x sigmoid(x), OPUS-MT's) or GELU (erf form).
Activation = Literal["relu", "swish", "gelu"]

# float16 is not offered: its range needs the loss scaling that training here does not do (bfloat16 has float32's).
Dtype = Literal["float32", "bfloat16"]
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer (defaults: the paper's base model).

    Each field's meaning is stated beside it, as its `help` metadata: the run config's reference shows it.
    """

    vocab_size: int = declared(37000, "size of the joint source/target vocabulary (token id 0 is padding).",
                              POSITIVE_INTEGER)
    num_layers: int = declared(6, "N, the number of layers in each of the encoder and decoder stacks.",
                              POSITIVE_INTEGER)
    d_model: int = declared(512, "width of every sublayer output and of the embeddings.", POSITIVE_INTEGER)
    d_ff: int = declared(2048, "inner width of the position-wise feed-forward networks.", POSITIVE_INTEGER)
    num_heads: int = declared(8, "h; each head has d_k = d_v = d_model / h.", POSITIVE_INTEGER)
    dropout_rate: float = declared(0.1, "P_drop, applied to each sublayer output and to embeddings + positions.",
                                   FRACTION)
    attention_dropout_rate: float = declared(0.0, "dropout on attention weights (not in the paper; 0 by default).",
                                             FRACTION)
    max_len: int = declared(512, "longest sequence the model accepts (learned positions and the decoding cache).",
                           POSITIVE_INTEGER)
    norm_position: NormPosition = declared("post",
        '"post" = LayerNorm(x + Dropout(Sublayer(x))) as in the paper; "pre" = x + Dropout(Sublayer(LayerNorm(x))) '
        "with a final LayerNorm after each stack.")
    positional_encoding: PositionalEncodingKind = declared("sinusoidal", '"sinusoidal" (the paper) or "learned".')
    share_embeddings: bool = declared(True, "one embedding table for source and target tokens (paper section 3.4).")
    tie_output_embedding: bool = declared(True, "the pre-softmax projection is the target embedding table, transposed.")
    output_bias: bool = declared(False,
        "a bias over the vocabulary added to the tied pre-softmax projection (not in the paper; Marian's "
        "`final_logits_bias`); an untied projection always has one.")
    activation: Activation = declared("relu",
        'the feed-forward non-linearity: "relu" (the paper), "swish" (OPUS-MT) or "gelu".')
    attention_backend: AttentionBackend = declared("auto",
        "\"auto\" (the platform's kernel: splash attention on TPUs, XLA's fused attention on GPUs, einsum on CPUs and "
        'with attention dropout), "einsum" (softmax(QK^T/sqrt(d_k))V written out; runs everywhere, allows attention '
        'dropout, exposes the weights), "fused" (jax.nn.dot_product_attention, XLA), "cudnn" (cuDNN; GPU only) or '
        '"splash" (TPU Pallas kernel).')
    dtype: Dtype = declared("float32", "compute dtype; softmax and logits stay float32 (float16 is not offered: its "
                            "range needs loss scaling, which training here does not do).")
    param_dtype: Dtype = declared("float32", "dtype parameters are stored in.")
    float32_dot_outputs: bool = declared(False,
        "matmuls return float32, rounded to the compute dtype after (the same values; XLA:CPU runs bfloat16 matmuls "
        "natively only this way; decoding caches are then float32). Decoding on CPUs sets it; see "
        "model/precision.py.")
    chunked_decoding_cache: bool = declared(True,
        "the decoding self-attention cache is kept in chunks of positions, each read under `lax.cond` only once a "
        "step reaches it (model/attention_cache.py): early steps read less. Off, one chunk read whole at every step "
        "of a beam search, with no conditional in its loop (one hypothesis a sentence keeps the chunks: XLA makes "
        "their conditionals selects). Decoding turns it off on GPUs, where each conditional waits for the host to "
        "read its predicate.")
    layer_norm_epsilon: float = declared(1e-6, "epsilon of every LayerNorm.", POSITIVE)
    scan_layers: bool = declared(False,
        "run each stack as one `nn.scan` over its N layers: compile time no longer grows with N; parameters are "
        "stacked with a leading layer axis (checkpoints of scanned and unscanned models are not interchangeable).")
    remat: RematPolicy = declared("none",
        'what each layer keeps for the backward pass, trading compute for activation memory: "none" (everything), '
        '"full" (only its input; the layer is recomputed), "dots" (projection outputs; attention weights, '
        "activations and norms are recomputed).")

    def __post_init__(self) -> None:
        _check_model({field.name: getattr(self, field.name) for field in dataclasses.fields(self)}, KEYWORDS)

    @property
    def head_dim(self) -> int:
        """d_k = d_v = d_model / h."""
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self) -> Any:
        """The jnp dtype activations are computed in."""
        return _DTYPES[self.dtype]

    @property
    def params_dtype(self) -> Any:
        """The jnp dtype parameters are stored in."""
        return _DTYPES[self.param_dtype]

    def runnable_on(self, platform: str) -> "TransformerConfig":
        """This config as it runs on `platform` ("cpu", "gpu", "tpu"): a model trained with cuDNN's attention
        evaluates and decodes with "fused" (the same attention, by XLA) where there is no cuDNN, and one trained
        with the splash kernel with "einsum" where there is no TPU (off TPUs the kernel only runs interpreted)."""
        if self.attention_backend == "cudnn" and platform != "gpu":
            return self.replace(attention_backend="fused")
        if self.attention_backend == "splash" and platform != "tpu":
            return self.replace(attention_backend="einsum")
        return self

    def replace(self, **changes: Any) -> "TransformerConfig":
        """A copy with some fields changed (validated again)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(
                f"unknown TransformerConfig key(s) {sorted(unknown)}; "
                f"valid keys: {sorted(f.name for f in dataclasses.fields(self))}"
            )
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
        """One of PRESETS ("base", "big", "tiny"), with optional field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides)
    @classmethod
    def for_run(cls, model_fields: Mapping[str, Any], vocab_size: int, max_length: int) -> "TransformerConfig":
        """A run's model: its `model` settings with the tokenizer's `vocab_size` (a set model.vocab_size must
        equal it), checked to hold pairs of `max_length` tokens (data.max_length) and the BOS position; a refusal
        names the run's key (`model.d_ff`) and its `--config.model.` flag."""
        fields = dict(model_fields)
        if fields["vocab_size"] not in (0, vocab_size):
            raise ConfigError(
                f"model.vocab_size={fields['vocab_size']} disagrees with the tokenizer's {vocab_size} "
                "pieces; set --config.model.vocab_size=0 (take the tokenizer's) or retrain the tokenizer"
            )
        fields["vocab_size"] = vocab_size
        _check_model(fields, run_keys("model"))
        model = cls(**fields)
        if model.max_len < max_length + 1:
            raise ConfigError(f"model.max_len={model.max_len} is shorter than data.max_length + 1 = "
                              f"{max_length + 1}; raise model.max_len (--config.model.max_len={max_length + 1})")
        return model


def _check_model(values: Mapping[str, Any], spelling: Spelling) -> None:
    """Each field inside its declared bound or choices, then the fields that constrain each other, named as
    `spelling` writes them."""
    check_declared(TransformerConfig, values, spelling)
    if values["d_model"] % values["num_heads"]:
        raise ConfigError(f"{spelling.named('d_model', values['d_model'])} is not divisible by num_heads="
                          f"{values['num_heads']}; {spelling.setter('num_heads')} to a divisor of d_model "
                          "(d_k = d_model / num_heads)")
    if values["attention_backend"] not in ("auto", "einsum") and values["attention_dropout_rate"] > 0:
        raise ConfigError(f"{spelling.named('attention_backend', values['attention_backend'])} cannot apply "
                          f"attention dropout; {spelling.setter('attention_dropout_rate')}=0 or "
                          f"{spelling.target('attention_backend')}=auto (einsum with attention "
                          "dropout)")


PRESETS: dict[str, TransformerConfig] = {
    # Table 3 of the paper, row "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1.
    "base": TransformerConfig(),
    # Row "big": d_model=1024, d_ff=4096, h=16, P_drop=0.3.
    "big": TransformerConfig(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
    # Small enough to train in minutes on two CPU cores; used by tests and the demo.
    "tiny": TransformerConfig(
        vocab_size=1000, num_layers=2, d_model=64, d_ff=256, num_heads=4, max_len=128
    ),
}
