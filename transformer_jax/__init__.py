"""transformer_jax: the Transformer of "Attention Is All You Need" as reusable Flax modules.

The package, by what a reader comes for (floors, lowest first: a folder imports only folders below it):
  errors.py    UserError, the root of every error a user can cause
  early_signals.py  stop signals that arrive while a command imports its modules, kept for it
  base/        files, console, device mesh and shardings, a run directory's layout, lock and logs, compilation cache
  model/       the paper's modules (attention, masks, embeddings, positions, layers, stacks, Transformer)
  decoding/    search settings, the key/value cache, greedy, sampling and beam search, decoding precision
  data/        corpora, SentencePiece, batch shapes and batches; the built-in synthetic corpus in data/builtin/
  config/      every run setting with its default and checks, and the reference generated from it
  checkpoints/ Orbax save/restore, integrity checks, choosing and averaging checkpoints
  training/    the paper's loss, schedule and Adam, train state and step (the base install); a split's dev loss
  evaluation/  SacreBLEU/chrF, translating text and splits, plots
  export/      a trained model for other runtimes (CTranslate2)
  run/         a training run: the run builder, assemble_run (mesh, data, programs, checkpointer), the Trainer
  cli/         the transformer-jax commands (train, score, translate, ...): flags, one-line errors, the run directory
  aot/         compiling a run for TPU topologies and GPUs on a host without them

Importing this package loads only JAX and Flax: the training and evaluation stacks load when used.
"""

# First: when this process is the transformer-jax command, a stop signal during the imports below is kept for it.
from transformer_jax import early_signals as _early_signals

_early_signals.record_if_command()


from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.sampling import greedy_decode, sample_decode
from transformer_jax.decoding.translate import decoding_precision, translate_batch
from transformer_jax.errors import ConfigError, UserError
from transformer_jax.model.attention import (
    DECODING_COLLECTIONS,
    MultiHeadAttention,
    attention_weights,
    scaled_dot_product_attention,
)
from transformer_jax.model.config import PRESETS, TransformerConfig
from transformer_jax.model.embeddings import TokenEmbedding
from transformer_jax.model.feed_forward import FeedForward
from transformer_jax.model.layers import DecoderLayer, EncoderLayer
from transformer_jax.model.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)
from transformer_jax.model.positional_encoding import (
    PositionalEncoding,
    sinusoidal_encoding,
)
from transformer_jax.model.special_tokens import PAD_ID
from transformer_jax.model.stacks import Decoder, Encoder
from transformer_jax.model.transformer import Transformer

__all__ = [
    "DECODING_COLLECTIONS",
    "PAD_ID",
    "PRESETS",
    "ConfigError",
    "DecodeOptions",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "UserError",
    "attention_weights",
    "beam_search",
    "causal_mask",
    "combine_masks",
    "decoding_precision",
    "greedy_decode",
    "padding_mask",
    "sample_decode",
    "scaled_dot_product_attention",
    "segment_mask",
    "sinusoidal_encoding",
    "translate_batch",
]
__version__ = "0.1.0"
