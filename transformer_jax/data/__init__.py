"""Data: parallel corpora, the SentencePiece tokenizer and the batches training reads.

`sources` (TFDS, text, TSV, the built-in corpus in `builtin/`) -> `tokenizer` (SentencePiece) ->
`encoded` (the tokenized corpus as flat arrays) -> `batching` (token-budget batches, packed or
length-bucketed, host shards, the resumable iterator, eval batches) -> `pipeline` (from a run
config to the tokenizer, the training iterator and the dev/test sets).
"""

from transformer_jax.data.batching import BatchIterator, eval_batches
from transformer_jax.data.encoded import EncodedPairs, Ragged, encode_pairs
from transformer_jax.data.pipeline import (
    EvalSet,
    RunData,
    eval_set,
    load_run_splits,
    prepare_data,
)
from transformer_jax.data.sources import Pair, load_splits
from transformer_jax.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
)

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "BatchIterator", "EncodedPairs", "EvalSet", "Pair", "Ragged",
    "RunData", "Tokenizer", "encode_pairs", "eval_batches", "eval_set", "load_run_splits", "load_splits",
    "prepare_data", "train_tokenizer",
]
