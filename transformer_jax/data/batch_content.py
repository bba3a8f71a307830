"""What an update holds in real tokens, and what fairseq's `--max-tokens` batches hold on the same corpus.

Batch sizes are quoted three ways, and they differ by the padding each counts:
- ours, `data.tokens_per_batch`: token slots per side (rows x width, padding included) of packed rows;
  packing fills most slots (about 93-97% on translation corpora), and the automatic row width sizes
  narrow rows to hold the real tokens of rows of data.max_length (data/row_width.py);
- fairseq's `--max-tokens N` (fairseq.data.data_utils.batch_by_size): pairs sorted by length, then
  batched greedily while sentences x (the longest of either side in the batch, EOS counted) stays <= N,
  so N bounds a padded batch and its real target tokens depend on how the lengths vary;
- the paper's "approximately 25000 source tokens and 25000 target tokens": real tokens.

`real_tokens_per_update` measures ours on a run's own batch plan; `fairseq_target_tokens` and
`fairseq_max_tokens_for` simulate fairseq's batching on the corpus's lengths, so a run can be stated in
fairseq's terms (the preflight prints both, given a corpus) and sized to equal it.
"""

from __future__ import annotations

import itertools

import numpy as np

from transformer_jax.data.batching import BatchIterator
from transformer_jax.model.special_tokens import PAD_ID

# Batches of our plan averaged; pairs of the corpus (at most) fairseq's batching is simulated on.
SAMPLED_BATCHES, SAMPLED_PAIRS = 20, 200_000
# fairseq's --required-batch-size-multiple default: a batch holds a multiple of 8 sentences when more fit.
FAIRSEQ_MULTIPLE = 8


def real_tokens_per_update(train: BatchIterator, batches: int = SAMPLED_BATCHES) -> tuple[float, float]:
    """Mean real (non-pad) source and target tokens of one global batch of `train`'s plan, EOS counted."""
    source, target = [], []
    for batch in itertools.islice(train.for_process(0, 1), batches):  # whole batches, from the start
        source.append(int(np.sum(batch["inputs"] != PAD_ID)))
        target.append(int(np.sum(batch["targets"] != PAD_ID)))
    return float(np.mean(source)), float(np.mean(target))


def fairseq_batches(source_lengths: np.ndarray, target_lengths: np.ndarray, max_tokens: int,
                    multiple: int = FAIRSEQ_MULTIPLE) -> list[np.ndarray]:
    """The pair indices of each batch fairseq 0.12 makes with `--max-tokens max_tokens` (lengths with EOS).

    Pairs sorted by (source, target) length; from each start, as many as fit with sentences x longest <=
    max_tokens, cut to a multiple of `multiple` (fairseq's --required-batch-size-multiple) when more fit.
    Pairs longer than max_tokens are left out, as fairseq leaves them out of training (or refuses them).
    """
    sizes = np.maximum(source_lengths, target_lengths)
    # LanguagePairDataset.ordered_indices: by target length, then (stably) by source length.
    order = np.argsort(target_lengths, kind="mergesort")
    order = order[np.argsort(source_lengths[order], kind="mergesort")]
    order = order[sizes[order] <= max_tokens]
    sorted_sizes = sizes[order].tolist()
    batches, start = [], 0
    while start < len(order):
        end, longest = start, 0
        while end < len(order) and max(longest, sorted_sizes[end]) * (end - start + 1) <= max_tokens:
            longest = max(longest, sorted_sizes[end])
            end += 1
        count = end - start
        if count > multiple:
            count -= count % multiple
        batches.append(order[start:start + count])
        start += count
    return batches


def fairseq_target_tokens(source_lengths: np.ndarray, target_lengths: np.ndarray, max_tokens: int) -> float:
    """Mean real target tokens (EOS counted: fairseq's "wpb") of fairseq's `--max-tokens` batches."""
    batches = fairseq_batches(source_lengths, target_lengths, max_tokens)
    return float(np.mean([target_lengths[batch].sum() for batch in batches]))


def fairseq_max_tokens_for(source_lengths: np.ndarray, target_lengths: np.ndarray, target_tokens: float) -> int:
    """The smallest `--max-tokens` (a multiple of 64) whose batches hold at least `target_tokens` real target
    tokens on average: the fairseq setting equal to an update of ours."""
    low, high = 1, 1
    while fairseq_target_tokens(source_lengths, target_lengths, high * 64) < target_tokens:
        low, high = high, high * 2
    while low < high:
        middle = (low + high) // 2
        if fairseq_target_tokens(source_lengths, target_lengths, middle * 64) < target_tokens:
            low = middle + 1
        else:
            high = middle
    return high * 64


def describe(train: BatchIterator) -> str:
    """The preflight's line: real tokens of an update of ours, and fairseq's --max-tokens that holds as many."""
    source, target = real_tokens_per_update(train)
    pairs = len(train.corpus)
    sample = np.random.default_rng(0).choice(pairs, SAMPLED_PAIRS, replace=False) if pairs > SAMPLED_PAIRS else None
    lengths = tuple(side.lengths if sample is None else side.lengths[sample]
                    for side in (train.corpus.source, train.corpus.target))
    same_setting = fairseq_target_tokens(*lengths, train.tokens_per_batch)
    equal = fairseq_max_tokens_for(*lengths, target)
    return (f"{source:,.0f} real source and {target:,.0f} real target tokens per update (data.tokens_per_batch="
            f"{train.tokens_per_batch} slots a side); on this corpus fairseq's --max-tokens {train.tokens_per_batch} "
            f"holds {same_setting:,.0f} real target tokens a batch, and --max-tokens {equal} holds as many as ours")
