"""Every batch-shape rule in one place: widths rounded to 8 (to the chip's tile on TPU/GPU), rows rounded to the mesh, training, loss and
translation shapes.

A compiled program exists per input shape, so every shape a run feeds comes from here: training batches
(`packed_batch_shape`, `length_buckets`; the corpus-sized packed widths of row_width.py build on these),
dev-loss batches (`loss_widths`), translation batches (`TranslationBatching`, `translation_rows`,
`translation_widths`) and the rows a mesh splits (`round_rows`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from transformer_jax.base import Bound, check_declared, declared
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import DataError
from transformer_jax.model.config import TransformerConfig

# The arrays of a training batch, all int32 [rows, length]; packed batches add segment ids and positions.
BATCH_KEYS = ("inputs", "targets", "target_inputs")
PACKED_KEYS = BATCH_KEYS + ("inputs_segmentation", "inputs_position", "targets_segmentation", "targets_position")
# Row widths are multiples of this on CPU (XLA:CPU's vectors), and of the platform's own tile where the
# corpus chooses the width (`width_multiple`).
WIDTH_MULTIPLE = 8
# Packed training rows on accelerators: TPU vregs are 8 sublanes x 128 lanes, and the attention scores'
# last axis (the keys, as wide as the row) lies along the lanes: a row of 112 tokens pays for 128 lanes.
# By libtpu's own figures for the base model's train step on v5e-8 at ~25k slots (BENCHMARKS.md), rows
# of 128 move 1,056 KB of HBM traffic per slot against 1,066 (112 and 120) and 1,112 (96), with the
# least temporary memory, and pack more real tokens per slot. GPUs: 64, the key/query block of the
# flash-attention kernels; by XLA's cost model over the CUDA plugin's H100 program (BENCHMARKS.md), rows
# of 64 move the fewest bytes per slot of 48-256, and 112 more than 128.
PLATFORM_WIDTH_MULTIPLES = {"tpu": 128, "gpu": 64, "cuda": 64, "rocm": 64}
# Source widths of translation batches: fine steps, as a batch's search runs at its padded source width.
TRANSLATION_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# A width holding at most this many batches of sentences is decoded at the next wider width in use.
SMALL_WIDTH_BATCHES = 4


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value."""
    return -(-int(value) // multiple) * multiple


def width_multiple(platform: str) -> int:
    """The multiple a platform's packed training rows are rounded to (PLATFORM_WIDTH_MULTIPLES; 8 on CPU)."""
    return PLATFORM_WIDTH_MULTIPLES.get(platform, WIDTH_MULTIPLE)


def round_width(tokens: int, max_length: int | None = None, multiple: int = WIDTH_MULTIPLE) -> int:
    """A row width for `tokens`: rounded up to `multiple` (at most max_length when given)."""
    width = round_up(tokens, multiple)
    return width if max_length is None else min(max_length, width)


def round_rows(rows: int, row_multiple: int) -> int:
    """Rows rounded up to a multiple of `row_multiple` (the mesh size), so every device gets as many."""
    return round_up(rows, row_multiple)


def length_buckets(max_length: int, smallest: int = 8) -> tuple[int, ...]:
    """Bucket lengths: multiples of 8 up to 32, then steps of about 1.5x, ending at max_length."""
    buckets, length = [], smallest
    while length < max_length:
        buckets.append(length)
        length = length + 8 if length < 32 else int(math.ceil(length * 1.5 / 8) * 8)
    return tuple(buckets) + (max_length,)


def rows_per_batch(tokens_per_batch: int, length: int, row_multiple: int) -> int:
    """Rows of `length` tokens in a budget of tokens_per_batch slots, rounded down to a multiple of row_multiple."""
    rows = tokens_per_batch // length // row_multiple * row_multiple
    if rows == 0:
        raise DataError(f"data.tokens_per_batch={tokens_per_batch} is too small for {row_multiple} rows (one per "
                        f"device) of {length} tokens; set --config.data.tokens_per_batch={row_multiple * length} "
                        "or more")
    return rows


def packed_batch_shape(tokens_per_batch: int, max_length: int, row_multiple: int = 1) -> tuple[int, int]:
    """(rows, width) of a packed global batch of rows of max_length tokens, rows a multiple of row_multiple."""
    return rows_per_batch(tokens_per_batch, max_length, row_multiple), max_length


def loss_widths(longest: int, row_width: int | None = None) -> tuple[int, int | None]:
    """(width, width of the longer pairs or None) of dev-loss batches for a split whose longest pair has
    `longest` tokens: that rounded up to 8, or `row_width` (the training row width) with the longer pairs
    in rows of their own."""
    widest = round_width(longest)
    if row_width is None or widest <= row_width:
        return widest, None
    return row_width, widest


# The largest batch_size and batch_tokens: batches are planned in int32 (a larger one would overflow there).
MAX_BATCHING = 2**30


@dataclasses.dataclass(frozen=True)
class TranslationBatching:
    """How a split's sentences are cut into translation batches (shapes only: not what the search does), validated
    on construction; each field's meaning and limit are declared beside it (the run's data.eval_batch_size and
    eval.batch_tokens read them)."""

    batch_size: int = declared(64, "sentences decoded together (at most), the rows of a batch.",
                               Bound(1, MAX_BATCHING, wording=f"a positive integer, at most 2**30 = {MAX_BATCHING}",
                                     short="[1, 2**30]"))
    batch_tokens: int = declared(0,
        "when > 0, a batch holds about this many source token slots (rows x the batch's padded source width, at most "
        "batch_size rows): long sentences go in fewer rows; 0: batch_size sentences a batch.",
        Bound(0, MAX_BATCHING, wording=f"0 (no token budget) or a positive integer, at most 2**30 = {MAX_BATCHING}",
              short="[0, 2**30]"))

    def __post_init__(self) -> None:
        check_declared(TranslationBatching, {field.name: getattr(self, field.name)
                                             for field in dataclasses.fields(self)})

    def replace(self, **changes: int | None) -> TranslationBatching:
        """A copy with some fields changed (None values are ignored; validated again)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


# Device-sized translation batches (`device_translation_batching`): the share of a device's free memory one
# batch's search may take (the rest: XLA's temporaries beside the estimate, fragmentation), the source width the
# budget is set at (sentences of WMT's test sets are mostly 16-48 pieces; wider batches get fewer rows by the
# token budget, which keeps them within it), and the most sentences a device searches together. At 2,048 sentences
# of beam 4, the step's largest matmul (8,192 hypotheses x d_model into the vocabulary) takes 0.07-0.3 ms of an
# H100/H200's dense bf16 peak at 8k-37k pieces, about what the step's ~190 kernel launches cost: past it a step
# stops being launch-bound, and a larger batch only holds more memory and reports progress less often.
SEARCH_MEMORY_SHARE = 0.5
SEARCH_BUDGET_WIDTH = 32
MAX_SEARCH_SENTENCES_PER_DEVICE = 2048


def search_bytes_per_sentence(model: TransformerConfig, hypotheses: int, width: int, max_extra_length: int,
                              cache_bytes: int) -> int:
    """Device memory the search of one sentence of source `width` holds at its peak (an estimate, per term):
    the self-attention cache of its `hypotheses` (N beams, 1 for greedy and sampling) over the output length,
    the encoder-decoder cache and the encoder's output, the encoder's float32 attention scores and weights over
    the width x width source pairs, a step's float32 logits, log-probabilities and candidate scores, the
    self-attention's float32 scores over the N x L slots, and the token tables."""
    length = min(width + max_extra_length, model.max_len)
    layers, d_model = model.num_layers, model.d_model
    self_cache = layers * 2 * hypotheses * length * d_model * cache_bytes
    cross_cache = layers * 2 * width * d_model * cache_bytes
    encoder = width * (d_model + model.d_ff) * max(cache_bytes, 2) * 2
    encoder_scores = model.num_heads * width * width * 4 * 2
    step = hypotheses * model.vocab_size * 4 * 3
    scores = model.num_heads * hypotheses * hypotheses * length * 4 * 2
    tokens = hypotheses * length * 4 * 6
    return self_cache + cross_cache + encoder + encoder_scores + step + scores + tokens


def device_translation_batching(model: TransformerConfig, options: DecodeOptions, free_bytes: int, devices: int,
                                cache_bytes: int) -> TranslationBatching:
    """Translation batches sized for `devices` devices of `free_bytes` free memory each (after the parameters):
    rows of SEARCH_BUDGET_WIDTH-token sources filling SEARCH_MEMORY_SHARE of it (at most
    MAX_SEARCH_SENTENCES_PER_DEVICE), and a token budget that keeps every wider batch within the same share.

    A wider batch has fewer rows (the token budget over its width), but a sentence's search grows faster than its
    width where the encoder's width x width scores weigh (small models, long sources): the budget is the least
    that every bucket width a source of the model can take (up to its widest) keeps to the share. Narrower batches
    have at most the rows, each smaller. One sentence a device is the least, even where it alone takes more."""
    hypotheses = options.beam_size if options.mode == "beam" else 1

    def per_sentence(width: int) -> int:
        return search_bytes_per_sentence(model, hypotheses, width, options.max_extra_length, cache_bytes)

    share = free_bytes * SEARCH_MEMORY_SHARE
    rows = int(min(MAX_SEARCH_SENTENCES_PER_DEVICE, max(1, share // per_sentence(SEARCH_BUDGET_WIDTH))))
    widest = widest_translation_width(model.max_len)
    top = next(width for width in TRANSLATION_BUCKETS if width >= widest)
    wider = [width for width in TRANSLATION_BUCKETS if SEARCH_BUDGET_WIDTH < width <= top]
    tokens = int(max(1, min([rows * SEARCH_BUDGET_WIDTH, *(share * width // per_sentence(width) for width in wider)])))
    return TranslationBatching(rows * devices, tokens * devices)


def translation_rows(width: int, batch_size: int, batch_tokens: int, row_multiple: int = 1) -> int:
    """Rows of a translation batch of padded source `width`: batch_size, or batch_tokens // width (at most
    batch_size) when batch_tokens > 0; rounded down to a multiple of row_multiple, at least one multiple."""
    rows = min(batch_size, batch_tokens // width) if batch_tokens else batch_size
    return max(row_multiple, rows // row_multiple * row_multiple)


def translation_widths(source_lengths: np.ndarray, batch_size: int, batch_tokens: int,
                       buckets: Sequence[int] = TRANSLATION_BUCKETS, row_multiple: int = 1) -> np.ndarray:
    """Each sentence's padded source width: its smallest bucket, small widths merged into wider ones.

    Beyond the last bucket, widths are multiples of it. Narrowest first, a width whose sentences fill
    at most SMALL_WIDTH_BATCHES batches of its rows joins the next wider width in use. (A width's compile
    costs more than decoding a few batches of its sentences a little wider.)
    """
    bucket_widths, lengths = np.asarray(buckets, np.int64), np.asarray(source_lengths, np.int64)
    smallest = bucket_widths[np.minimum(np.searchsorted(bucket_widths, lengths), len(buckets) - 1)]
    widths = np.where(lengths <= buckets[-1], smallest, -(-lengths // buckets[-1]) * buckets[-1])
    used = sorted(set(widths.tolist()))
    for narrow, wide in zip(used, used[1:]):
        members = widths == narrow
        if members.sum() <= SMALL_WIDTH_BATCHES * translation_rows(narrow, batch_size, batch_tokens, row_multiple):
            widths[members] = wide
    return widths


def widest_translation_width(max_len: int) -> int:
    """The widest source a model of `max_len` positions translates (longer sources are cut to it)."""
    return min(TRANSLATION_BUCKETS[-1], max_len)


@dataclasses.dataclass(frozen=True)
class BatchShapes:
    """The global batch shapes a run's programs take, (rows, width) int32 arrays split over the mesh's rows.

    Attributes:
      train: every shape of the training batches (of one micro-batch with gradient accumulation).
      train_keys: the arrays of a training batch (BATCH_KEYS, or PACKED_KEYS when packed).
      dev_loss: the shapes of the dev-loss batches (always packed).
      translation: the widest translation batch of the dev/test splits (rows, source width).
      origin: where the shapes come from: "the corpus", or rows of data.max_length when no corpus is at hand.
    """

    train: tuple[tuple[int, int], ...]
    train_keys: tuple[str, ...]
    dev_loss: tuple[tuple[int, int], ...]
    translation: tuple[int, int]
    origin: str = "the corpus"

    def describe(self) -> str:
        """The shapes in words, e.g. 'train 40x64, 8x256; dev loss 64x128; translation 64x256 (from the corpus)'."""
        def join(shapes: Sequence[tuple[int, int]]) -> str:
            return ", ".join(f"{rows}x{width}" for rows, width in shapes)

        return (f"train {join(self.train)}; dev loss {join(self.dev_loss)}; translation {join([self.translation])} "
                f"(rows x tokens, from {self.origin})")


def nominal_batch_shapes(tokens_per_batch: int, max_length: int, pack: bool, eval_batch_size: int,
                         batching: TranslationBatching, model_max_len: int, row_multiple: int) -> BatchShapes:
    """The shapes without a corpus: training rows of max_length, dev loss and translation at their widest."""
    widest = widest_translation_width(model_max_len)
    return BatchShapes(
        train=(packed_batch_shape(tokens_per_batch, max_length, row_multiple),),
        train_keys=PACKED_KEYS if pack else BATCH_KEYS,
        dev_loss=((round_rows(eval_batch_size, row_multiple), round_width(max_length)),),
        translation=(translation_rows(widest, batching.batch_size, batching.batch_tokens, row_multiple), widest),
        origin="no corpus: rows of data.max_length",
    )
