"""Batching: token budget, bucket shapes, packing with segment-aware shift, sharding, resume."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.data import batching
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID
from transformer_jax.errors import DataError
from transformer_jax.model import masks
from transformer_jax.model.masks import PAD_ID

FIRST_ID = 1_000  # every synthetic pair starts with FIRST_ID + its index, so batches can be traced back


def synthetic_corpus(num_pairs: int, mean_length: float, max_length: int, seed: int = 0) -> EncodedPairs:
    """WMT-like lengths: lognormal source lengths, targets about 10% longer; ids trace the pair index."""
    rng = np.random.default_rng(seed)
    source_lengths = np.clip(rng.lognormal(np.log(mean_length * 0.85), 0.55, num_pairs), 2, max_length)
    target_lengths = np.clip(source_lengths * rng.lognormal(0.1, 0.15, num_pairs), 2, max_length)
    sides = []
    for lengths in (source_lengths.astype(int), target_lengths.astype(int)):
        sides.append(Ragged.from_lists([[FIRST_ID + i] + rng.integers(4, FIRST_ID, n - 2).tolist() + [EOS_ID]
                                        for i, n in enumerate(lengths)]))
    return EncodedPairs(*sides)


def pair_ids(batch, name="inputs"):
    """Indices of the pairs in a batch (the first token of every segment)."""
    tokens = batch[name]
    if f"{name}_position" in batch:
        starts = (batch[f"{name}_position"] == 0) & (tokens != PAD_ID)
    else:
        starts = np.zeros_like(tokens, dtype=bool)
        starts[:, 0] = tokens[:, 0] != PAD_ID
    return (tokens[starts] - FIRST_ID).tolist()


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(3_000, mean_length=27, max_length=128)


# Batching modes: length buckets, packed rows of max_length, packed rows of 48 tokens (pairs longer
# than 48 in rows of their own, 128 wide: two shapes), and the same widths with rows given per width
# (as row_width.py sizes them by real tokens: more slots than tokens_per_batch at the narrow width).
MODES = {"buckets": {"pack": False}, "rows of max_length": {"pack": True},
         "narrow rows": {"pack": True, "row_width": 48},
         "rows per width": {"pack": True, "row_width": 48, "rows_per_width": {48: 48, 128: 12}}}


def one_epoch(iterator):
    return [next(iterator) for _ in range(len(iterator.plan(iterator.epoch)))]


@pytest.mark.parametrize("mode", MODES)
def test_an_epoch_holds_every_pair_once_within_the_token_budget(corpus, mode):
    iterator = batching.BatchIterator(corpus, tokens_per_batch=2_048, max_length=128, row_multiple=4, **MODES[mode])
    batches = one_epoch(iterator)
    assert sorted(i for b in batches for i in pair_ids(b)) == list(range(len(corpus)))
    assert sorted(i for b in batches for i in pair_ids(b, "targets")) == list(range(len(corpus)))
    shapes = set(iterator.shapes())
    for batch in batches:
        rows, length = batch["inputs"].shape
        given = MODES[mode].get("rows_per_width")
        assert (rows == given[length] if given else rows * length <= 2_048) and rows % 4 == 0
        assert (rows, length) in shapes
        assert batch["targets"].shape == batch["target_inputs"].shape == (rows, length)
        assert all(v.dtype == np.int32 for v in batch.values())
    assert len({b["inputs"].shape for b in batches}) <= len(batching.length_buckets(128))
    if mode in ("narrow rows", "rows per width"):  # pairs up to 48 tokens in 48-wide rows, the longer in rows of 128
        assert {b["inputs"].shape for b in batches} == ({(40, 48), (16, 128)} if mode == "narrow rows"
                                                        else {(48, 48), (12, 128)})
        longest = {width: max(max(len(corpus.source[i]), len(corpus.target[i])) for b in batches
                              if b["inputs"].shape[1] == width for i in pair_ids(b)) for width in (48, 128)}
        assert longest[48] == 48 and longest[128] > 48
        wide = [pair_ids(b) for b in batches if b["inputs"].shape[1] == 128]
        # The long pairs are packed too, several to a row (but in the one batch of them that is not full).
        assert sorted(map(len, wide))[1] > (16 if mode == "narrow rows" else 12)


def test_rows_hold_the_right_pair_with_eos_and_shifted_targets(corpus):
    iterator = batching.BatchIterator(corpus, tokens_per_batch=1_024, max_length=128, pack=False)
    batch = next(iterator)
    for row, index in enumerate(pair_ids(batch)):
        source, target = corpus.source[index], corpus.target[index]
        assert batch["inputs"][row, :len(source)].tolist() == source.tolist()
        assert source[-1] == EOS_ID and source[0] != BOS_ID  # the source has EOS and no BOS
        assert batch["targets"][row, :len(target)].tolist() == target.tolist()
        assert batch["target_inputs"][row, :len(target)].tolist() == [BOS_ID] + target[:-1].tolist()
        assert not batch["inputs"][row, len(source):].any() and not batch["targets"][row, len(target):].any()


@pytest.mark.parametrize("mode", ["rows of max_length", "narrow rows", "rows per width"])
def test_packed_segments_start_with_bos_and_never_attend_to_each_other(corpus, mode):
    iterator = batching.BatchIterator(corpus, tokens_per_batch=4_096, max_length=128, **MODES[mode])
    batch = next(b for b in iterator if b["inputs"].shape[1] == MODES[mode].get("row_width", 128))
    segments, positions = batch["targets_segmentation"], batch["targets_position"]
    assert segments.max() > 1  # rows really hold several pairs
    starts = (positions == 0) & (segments > 0)
    assert (batch["target_inputs"][starts] == BOS_ID).all()
    assert ((batch["target_inputs"] == BOS_ID) == starts).all()
    inside = (positions > 0)
    assert (batch["target_inputs"][:, 1:][inside[:, 1:]] == batch["targets"][:, :-1][inside[:, 1:]]).all()
    assert ((segments == 0) == (batch["targets"] == PAD_ID)).all()
    # The decoder self-attention mask built from these ids: a query sees only earlier tokens of its pair.
    mask = np.asarray(masks.combine_masks(masks.segment_mask(jnp.asarray(segments), jnp.asarray(segments)),
                                          masks.causal_mask(segments.shape[1])))[:, 0]
    same_pair = segments[:, :, None] == segments[:, None, :]
    assert not mask[~same_pair].any()
    for row in np.flatnonzero(segments.max(1) >= 2)[:3]:
        query = np.flatnonzero(segments[row] == 2)[-1]  # the last token of the second pair
        assert mask[row, query].nonzero()[0].tolist() == np.flatnonzero(segments[row] == 2).tolist()
    cross = np.asarray(masks.segment_mask(jnp.asarray(segments), jnp.asarray(batch["inputs_segmentation"])))[:, 0]
    assert not cross[segments[:, :, None] != batch["inputs_segmentation"][:, None, :]].any()


def padding_efficiency(batches) -> float:
    """Real tokens / token slots over `inputs` and `targets` of materialized batches (padding is id 0)."""
    real = sum(int(np.count_nonzero(b["inputs"])) + int(np.count_nonzero(b["targets"])) for b in batches)
    slots = sum(b["inputs"].size + b["targets"].size for b in batches)
    return real / slots


def test_padding_efficiency_on_wmt_like_lengths(capsys):
    corpus = synthetic_corpus(20_000, mean_length=27, max_length=256, seed=1)
    efficiencies = {}
    for pack in (True, False):
        iterator = batching.BatchIterator(corpus, tokens_per_batch=4_096, max_length=256, pack=pack)
        efficiencies[pack] = padding_efficiency(one_epoch(iterator))
        assert efficiencies[pack] == pytest.approx(iterator.plan(0).efficiency(corpus))
    with capsys.disabled():
        print(f"\npadding efficiency (real tokens / slots), WMT-like lengths: packed {efficiencies[True]:.1%}, "
              f"bucketed {efficiencies[False]:.1%}")
    assert efficiencies[True] >= 0.9
    assert efficiencies[False] >= 0.7


@pytest.mark.parametrize("mode", MODES)
def test_host_shards_are_disjoint_cover_the_epoch_and_agree_on_shapes(corpus, mode):
    shards = [batching.BatchIterator(corpus, 2_048, 128, seed=3, process_index=p, process_count=3, **MODES[mode])
              for p in range(3)]
    epochs = [one_epoch(shard) for shard in shards]
    assert len({len(epoch) for epoch in epochs}) == 1  # same number of steps everywhere
    for step in zip(*epochs):
        assert len({batch["inputs"].shape for batch in step}) == 1  # same shape at every step
    ids = [sorted(i for batch in epoch for i in pair_ids(batch)) for epoch in epochs]
    assert all(ids) and not set(ids[0]) & set(ids[1]) and not set(ids[1]) & set(ids[2])
    assert sorted(ids[0] + ids[1] + ids[2]) == list(range(len(corpus)))


@pytest.mark.parametrize("mode", MODES)
def test_restoring_the_state_at_step_k_gives_the_same_next_batches(corpus, mode):
    def make():
        return batching.BatchIterator(corpus, 2_048, 128, seed=5, **MODES[mode])

    reference = make()
    epoch_length = len(reference.plan(0))
    expected = [next(reference) for _ in range(epoch_length + 5)]
    for k in (0, 7, epoch_length - 2):  # the last one crosses into the next epoch
        first = make()
        for _ in range(k):
            next(first)
        state = json.loads(json.dumps(first.get_state()))
        resumed = make()
        resumed.set_state(state)
        for offset in range(5):
            batch = next(resumed)
            assert all(np.array_equal(batch[key], expected[k + offset][key]) for key in batch)
    assert pair_ids(expected[epoch_length]) != pair_ids(expected[0])  # a new order every epoch


def test_a_state_resumes_only_where_the_epochs_are_planned_alike(corpus):
    """Device count and batch settings change the plan only through the batch shapes: the same shapes
    continue exactly; other shapes are a DataError naming the change, never a silent shift."""
    saved = batching.BatchIterator(corpus, 2_000, 128, row_multiple=2, seed=5)  # 2_000 // 128 = 15 -> 14 rows
    for _ in range(3):
        next(saved)
    state = json.loads(json.dumps(saved.get_state()))
    assert state["layout"]["batch_shapes"] == [[14, 128]] and state["layout"]["devices"] == 2
    expected = [next(saved) for _ in range(3)]

    def resumed(*args, **kwargs):
        iterator = batching.BatchIterator(corpus, *args, seed=5, **kwargs)
        iterator.set_state(state)
        return iterator

    # 2 devices in 2 processes, or 1 device with 1_800 tokens: 14 rows of 128 again, the same epochs.
    halves = [resumed(2_000, 128, row_multiple=2, process_index=p, process_count=2) for p in range(2)]
    one_device = resumed(1_800, 128, row_multiple=1)
    for want in expected:
        got = [next(half) for half in halves]
        assert all(np.array_equal(np.concatenate([got[0][k], got[1][k]]), want[k]) for k in want)
        assert all(np.array_equal(value, want[key]) for key, value in next(one_device).items())
    with pytest.raises(DataError, match=r"batches are 14x128 .* would be 15x128 \(devices 2 -> 1\).*new workdir"):
        resumed(2_000, 128, row_multiple=1)
    with pytest.raises(DataError, match=r"would be 20x128 \(data.tokens_per_batch 2000 -> 2560\)"):
        resumed(2_560, 128, row_multiple=2)
    with pytest.raises(DataError, match="data.pack True -> False"):
        resumed(2_000, 128, pack=False, row_multiple=2)
    # Another row width: the message names it and the setting that gives the checkpoint's rows back.
    with pytest.raises(DataError, match=r"would be 40x48, 14x128 \(data.row_width 128 -> 48\).*row_width=128\)"):
        resumed(2_000, 128, row_multiple=2, row_width=48)
    assert resumed(2_000, 128, row_multiple=2, row_width=128).get_state()["position"] == 3
    # A state saved before the layout was recorded resumes as before, unchecked.
    del state["layout"]
    assert resumed(2_000, 128, row_multiple=1).get_state()["position"] == 3


def test_rows_given_per_width_are_part_of_the_plan_a_state_resumes(corpus):
    """Rows sized by real tokens (row_width.py) are recorded like any batch shape: other rows (another
    fill, budget or sizing) are a DataError naming the setting that plans the checkpoint's rows again."""
    sized = {"row_width": 48, "rows_per_width": {48: 44, 128: 16}}

    def state_after_three(**kwargs):
        iterator = batching.BatchIterator(corpus, 2_000, 128, seed=5, **kwargs)
        for _ in range(3):
            next(iterator)
        return json.loads(json.dumps(iterator.get_state())), next(iterator)

    def resumed(state, **kwargs):
        iterator = batching.BatchIterator(corpus, 2_000, 128, seed=5, **kwargs)
        iterator.set_state(state)
        return iterator

    state, expected = state_after_three(**sized)
    assert state["layout"]["batch_shapes"] == [[44, 48], [16, 128]]
    assert state["layout"]["rows_sized_for"] == "real tokens"
    assert all(np.array_equal(value, expected[key]) for key, value in next(resumed(state, **sized)).items())
    with pytest.raises(DataError, match=r"batches are 44x48, 16x128 .* would be 48x48, 16x128 \(other buckets or rows"):
        resumed(state, row_width=48, rows_per_width={48: 48, 128: 16})
    with pytest.raises(DataError, match=r"would be 41x48, 15x128 \(rows sized for real tokens -> slots\).*row_width=0"):
        resumed(state, row_width=48)
    # Rows of tokens_per_batch slots at the same width (an explicit width, or a checkpoint from before the
    # rows were sized by real tokens, whose layout has no "rows_sized_for"): the explicit width resumes it.
    slots_state, _ = state_after_three(row_width=48)
    with pytest.raises(DataError, match=r"\(rows sized for slots -> real tokens\).*--config.data.row_width=48\)"):
        resumed(slots_state, **sized)
    del slots_state["layout"]["rows_sized_for"]
    with pytest.raises(DataError, match=r"would be 44x48, 16x128 \(other buckets or rows per width\).*row_width=48\)"):
        resumed(slots_state, **sized)
    assert resumed(slots_state, row_width=48).get_state()["position"] == 3
    with pytest.raises(ValueError, match="lacks the widths"):
        batching.BatchIterator(corpus, 2_000, 128, row_width=48, rows_per_width={48: 44})
    with pytest.raises(ValueError, match="positive multiple of 4"):
        batching.BatchIterator(corpus, 2_000, 128, row_multiple=4, **sized | {"rows_per_width": {48: 42, 128: 16}})


def test_bad_configuration_and_state_are_data_errors(corpus):
    with pytest.raises(DataError, match="tokens_per_batch=100 is too small"):
        next(batching.BatchIterator(corpus, 100, 128))
    iterator = batching.BatchIterator(corpus, 2_048, 128, seed=1)
    with pytest.raises(DataError, match=r"training.seed=1 differs from the 2 .* set --config.training.seed=2"):
        iterator.set_state({"seed": 2, "epoch": 0, "position": 0, "num_examples": len(corpus)})
    saved = {"seed": 1, "epoch": 0, "position": 0, "num_examples": len(corpus) + 5, "layout": {"max_length": 256}}
    with pytest.raises(DataError, match=rf"saved for {len(corpus) + 5} training pairs, but the corpus now gives "
                                        rf"{len(corpus)}; set --config.data.max_length=256 \(it was 256, now 128\)"):
        iterator.set_state(saved)
    with pytest.raises(DataError, match="longer than the packed row"):
        next(batching.BatchIterator(corpus, 2_048, 32))
    with pytest.raises(DataError, match="process_index"):
        batching.BatchIterator(corpus, 2_048, 128, process_index=2, process_count=2)
    two_epochs = batching.BatchIterator(corpus, 8_192, 128, num_epochs=2)
    assert len(list(two_epochs)) == 2 * len(two_epochs.plan(0)) and two_epochs.epoch == 2


def test_eval_batches_keep_every_pair_in_a_recoverable_order():
    corpus = EncodedPairs(Ragged.from_lists([[5, EOS_ID], [EOS_ID], [6] * 299 + [EOS_ID], [7, 8, EOS_ID]]),
                          Ragged.from_lists([[9, EOS_ID], [10, EOS_ID], [11, EOS_ID], [EOS_ID]]))
    batches = batching.eval_batches(corpus, batch_size=3)
    assert [b["inputs"].shape for b in batches] == [(3, 512), (3, 16)]  # the 300-token pair is kept
    indices = [i for b in batches for i in b["index"].tolist()]
    assert sorted(indices) == [-1, -1, 0, 1, 2, 3]
    outputs = [f"out{i}" for i in indices]
    assert batching.restore_order(outputs, indices, 4) == ["out0", "out1", "out2", "out3"]
    rows = {i: b["inputs"][r] for b in batches for r, i in enumerate(b["index"].tolist())}
    assert rows[1][:2].tolist() == [EOS_ID, PAD_ID]  # an empty source line stays, as EOS alone
    sharded = [batching.eval_batches(corpus, 4, process_index=p, process_count=2) for p in range(2)]
    assert sorted(i for shard in sharded for b in shard for i in b["index"].tolist() if i >= 0) == [0, 1, 2, 3]


def test_the_next_epoch_is_planned_in_the_background_and_gives_the_same_batches(corpus, monkeypatch):
    """A large corpus plans epoch e+1 while epoch e is read; the batches across the boundary are unchanged."""
    def batches(ahead: bool) -> tuple[list, batching.BatchIterator]:
        monkeypatch.setattr(batching, "PLAN_AHEAD_PAIRS", 0 if ahead else 10**9)
        iterator = batching.BatchIterator(corpus, tokens_per_batch=2048, max_length=128, row_width=48, seed=5)
        first = next(iterator)
        if ahead:  # epoch 1 is being planned (or done) before epoch 0 has been read to its end
            assert iterator._planning is not None and iterator._planning[0] == 1
            iterator._planning[1].join()
            assert set(iterator._plans) == {0, 1}
        steps = len(iterator.plan(0)) + 3
        return [first] + [next(iterator) for _ in range(steps)], iterator

    expected, _ = batches(ahead=False)
    got, iterator = batches(ahead=True)
    assert iterator.epoch == 1 and set(iterator._plans) <= {1, 2}  # epoch 0's plan was let go
    for want, have in zip(expected, got, strict=True):
        assert all(np.array_equal(want[key], have[key]) for key in want)
