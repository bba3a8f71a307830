"""Batch content: real tokens of our updates, and fairseq's --max-tokens batching simulated on the same lengths."""

import numpy as np
import pytest

from transformer_jax.data.batch_content import (
    fairseq_batches,
    fairseq_max_tokens_for,
    fairseq_target_tokens,
    real_tokens_per_update,
)
from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import EncodedPairs, Ragged


def test_fairseq_batches_by_hand():
    # Sorted sizes 3 3 3 3 5 5 10: four 3s fill 12 tokens; a 5 would make 5 x 5 = 25.
    source = np.array([10, 3, 5, 3, 3, 5, 3])
    target = np.array([9, 3, 4, 2, 3, 5, 1])
    batches = fairseq_batches(source, target, max_tokens=12, multiple=1)
    assert [sorted(batch.tolist()) for batch in batches] == [[1, 3, 4, 6], [2, 5], [0]]
    # --required-batch-size-multiple 3: the four 3s that fit are cut to three; the fourth starts the next
    # batch, which then holds it and a 5 (5 x 2 = 10), then the other 5, then the 10.
    cut = fairseq_batches(source, target, max_tokens=12, multiple=3)
    assert [sorted(batch.tolist()) for batch in cut] == [[1, 3, 6], [2, 4], [5], [0]]
    assert fairseq_target_tokens(source, target, 12) == pytest.approx(target.sum() / 3)
    # A pair longer than --max-tokens is left out.
    assert 0 not in np.concatenate(fairseq_batches(source, target, max_tokens=9, multiple=1))


def test_every_fairseq_batch_fits_and_is_greedy():
    rng = np.random.default_rng(0)
    source = rng.integers(2, 60, 3000)
    target = np.clip(source + rng.integers(-5, 8, 3000), 2, None)
    sizes = np.maximum(source, target)
    batches = fairseq_batches(source, target, max_tokens=512)
    assert sorted(np.concatenate(batches).tolist()) == list(range(3000))  # each pair once
    for batch, following in zip(batches, batches[1:]):
        assert len(batch) * sizes[batch].max() <= 512
        grown = np.concatenate([batch, following[:1]])
        assert len(batch) % 8 == 0 or len(grown) * sizes[grown].max() > 512  # cut to 8s, or full


def test_the_equal_max_tokens_is_the_smallest_that_holds_as_many_target_tokens():
    rng = np.random.default_rng(1)
    source = rng.integers(2, 40, 5000)
    target = rng.integers(2, 40, 5000)
    wanted = 3000.0
    found = fairseq_max_tokens_for(source, target, wanted)
    assert found % 64 == 0
    assert fairseq_target_tokens(source, target, found) >= wanted > fairseq_target_tokens(source, target, found - 64)


def test_real_tokens_of_an_update_are_the_non_pad_tokens_of_its_batches():
    rng = np.random.default_rng(2)
    lengths = rng.integers(3, 20, (400, 2))
    corpus = EncodedPairs(*(Ragged.from_lists([list(range(4, 4 + n - 1)) + [3] for n in lengths[:, side]])
                            for side in (0, 1)))
    train = BatchIterator(corpus, tokens_per_batch=512, max_length=32, seed=0)
    source, target = real_tokens_per_update(train, batches=5)
    batches = [next(train) for _ in range(5)]
    assert source == pytest.approx(np.mean([np.sum(b["inputs"] != 0) for b in batches]))
    assert target == pytest.approx(np.mean([np.sum(b["targets"] != 0) for b in batches]))
    assert 0.8 * 512 < target <= 512  # packed rows: most of the 512 slots a side hold real tokens
