"""Data: parallel corpora, the SentencePiece tokenizer and the batches training and evaluation read.

`sources` (TFDS, text, TSV, the built-in corpus in `builtin/`) -> `tokenizer` (SentencePiece) ->
`encoded` (the tokenized corpus as flat arrays) -> `prepared` (the training split tokenized once into
token shards and a length index, read by row) -> `corpus_writer` (a prepared corpus written: shards encoded by
worker processes, then the index, dev/test text and manifest) -> `shapes` (every batch-shape rule: widths, rows,
training, dev-loss and translation shapes) -> `batching` (token-budget batches, packed or
length-bucketed, host shards, the resumable iterator) -> `batch_content` (an update's real tokens,
and fairseq's --max-tokens batches on the same corpus) -> `row_width` (packed row widths chosen from
the corpus) -> `translation_batches` (a split's sentences in batches by source length) -> `pipeline`
(from a run config to its prepared corpus, the tokenizer, the training iterator, the dev/test sets and their batch shapes).
"""

from transformer_jax.data.batching import BatchIterator, eval_batches, restore_order
from transformer_jax.data.builtin import generate_pairs
from transformer_jax.data.encoded import EncodedPairs, Ragged, encode_pairs, filter_by_length
from transformer_jax.data.marian_vocabulary import MarianVocabulary
from transformer_jax.data.pipeline import (
    EvalSet,
    RunData,
    eval_set,
    load_run_splits,
    prepare_corpus,
    prepare_data,
    run_split,
)
from transformer_jax.data.corpus_writer import SHARD_PAIRS, finish_prepared, shard_dtype, write_prepared, write_shard
from transformer_jax.data.prepared import MANIFEST, PreparedCorpus, shard_name
from transformer_jax.data.row_width import choose_packed_rows
from transformer_jax.data.shapes import (
    PACKED_KEYS,
    BatchShapes,
    TranslationBatching,
    nominal_batch_shapes,
    width_multiple,
)
from transformer_jax.data.sources import Pair, load_splits, read_lines
from transformer_jax.data.tokenizer import Tokenizer, sample_sentences, train_tokenizer

__all__ = [
    "MANIFEST",
    "PACKED_KEYS",
    "SHARD_PAIRS",
    "BatchIterator",
    "BatchShapes",
    "EncodedPairs",
    "EvalSet",
    "MarianVocabulary",
    "Pair",
    "PreparedCorpus",
    "Ragged",
    "RunData",
    "Tokenizer",
    "TranslationBatching",
    "choose_packed_rows",
    "encode_pairs",
    "eval_batches",
    "eval_set",
    "filter_by_length",
    "finish_prepared",
    "generate_pairs",
    "load_run_splits",
    "load_splits",
    "nominal_batch_shapes",
    "prepare_corpus",
    "prepare_data",
    "read_lines",
    "restore_order",
    "run_split",
    "sample_sentences",
    "shard_dtype",
    "shard_name",
    "train_tokenizer",
    "width_multiple",
    "write_prepared",
    "write_shard",
]
