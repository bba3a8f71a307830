"""Dev/test loss over a split: packed into rows as wide as the split needs, the same loss as padded rows."""

import flax.linen as nn
import jax
import numpy as np
import optax

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.data.batching import eval_batches
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.model.special_tokens import EOS_ID
from transformer_jax.data.shapes import loss_widths
from transformer_jax.training.dev_loss import evaluate_loss, loss_batches
from transformer_jax.model.masks import PAD_ID
from transformer_jax.training.state import create_train_state
from transformer_jax.training.step import eval_step

VOCAB = 60


def short_split(num_pairs: int, longest: int = 14, seed: int = 0) -> EncodedPairs:
    """Short sentences (1 to `longest` tokens, EOS last); each pair's first source id is 4 + its index mod 50."""
    rng = np.random.default_rng(seed)

    def sentence(length: int, first: int) -> list[int]:
        return ([first] + rng.integers(4, VOCAB, max(length - 2, 0)).tolist())[:length - 1] + [EOS_ID]

    lengths = rng.integers(1, longest + 1, size=(2, num_pairs))
    return EncodedPairs(Ragged.from_lists([sentence(n, 4 + i % 50) for i, n in enumerate(lengths[0])]),
                        Ragged.from_lists([sentence(n, 4) for n in lengths[1]]))


def longest_pair(split: EncodedPairs) -> int:
    return int(max(split.source.lengths.max(), split.target.lengths.max()))


def test_every_pair_is_packed_once_into_rows_as_wide_as_the_split():
    split = short_split(300)
    assert loss_widths(longest_pair(split)) == (16, None) and loss_widths(longest_pair(split), 24) == (16, None)  # 14 tokens at most
    long_pair = EncodedPairs(Ragged.from_lists([[7] * 39 + [EOS_ID]]), Ragged.from_lists([[8, EOS_ID]]))
    with_long = EncodedPairs(*(Ragged.from_lists([side[i].tolist() for i in range(len(side))] + [extra[0].tolist()])
                               for side, extra in ((split.source, long_pair.source), (split.target, long_pair.target))))
    assert loss_widths(longest_pair(with_long), 24) == (24, 40) and loss_widths(longest_pair(with_long)) == (40, None)
    batches = loss_batches(with_long, rows=10, row_width=24, row_multiple=4)  # 10 rows, padded to 12
    assert {b["inputs"].shape for b in batches} == {(12, 24), (12, 40)}
    assert all((b[key][10:] == 0).all() for b in batches for key in b)  # the padding rows: PAD, segment 0
    unpadded = loss_batches(with_long, rows=10, row_width=24)  # the same batches on any number of devices
    assert all(np.array_equal(b[key][:10], u[key]) for b, u in zip(batches, unpadded) for key in b)
    pairs = []
    for batch in batches:
        for row in range(batch["inputs"].shape[0]):
            for segment in range(1, int(batch["inputs_segmentation"][row].max()) + 1):
                source = batch["inputs"][row][batch["inputs_segmentation"][row] == segment]
                target = batch["targets"][row][batch["targets_segmentation"][row] == segment]
                assert (batch["inputs_position"][row][batch["inputs_segmentation"][row] == segment]
                        == np.arange(len(source))).all()  # positions restart in every pair
                pairs.append((tuple(source), tuple(target)))
        assert ((batch["inputs_segmentation"] == 0) == (batch["inputs"] == PAD_ID)).all()
    expected = [(tuple(with_long.source[i]), tuple(with_long.target[i])) for i in range(len(with_long))]
    assert sorted(pairs) == sorted(expected)  # every pair once, whole
    assert max(int(b["inputs_segmentation"].max()) for b in batches) > 2  # several pairs to a row


def test_dev_loss_is_the_same_packed_as_in_the_padded_rows_of_before():
    """Padding is masked and segments keep to themselves: packing into narrow rows changes no loss."""
    model = Transformer(TransformerConfig.preset("tiny", vocab_size=VOCAB, max_len=65))
    params = nn.meta.unbox(create_train_state(model, optax.sgd(0.1), seed=0).params)
    params = jax.tree.map(lambda x: 2.0 * x, params)  # far from uniform predictions: the losses differ by token
    step = jax.jit(lambda p, b: eval_step(p, model.apply, b, 0.1))
    split = short_split(200)
    max_length = 64  # training rows of max_length: the old dev batches' widest bucket
    packed = loss_batches(split, 32, row_width=max_length)
    assert {b["inputs"].shape[1] for b in packed} == {16}  # the split's longest pair (14) rounded up to 8
    padded = [{k: v for k, v in b.items() if k != "index"} for b in eval_batches(split, 32)]
    assert sum(b["inputs"].size for b in packed) < 0.6 * sum(b["inputs"].size for b in padded)
    sums = {key: sum(float(np.sum(step(params, b)[key])) for b in padded)  # each batch's sums per row
            for key in ("loss", "nll", "correct", "tokens")}
    tokens = sums["tokens"]
    new = evaluate_loss(step, params, split, 32, row_width=max_length)
    assert tokens == sum(int(n) for n in split.target.lengths)
    np.testing.assert_allclose(new["loss"], sums["loss"] / tokens, rtol=1e-5)
    np.testing.assert_allclose(new["nll"], sums["nll"] / tokens, rtol=1e-5)
    np.testing.assert_allclose(new["accuracy"], sums["correct"] / tokens, rtol=1e-6)
    # The check can fail: the same packed rows without segment ids and positions (pairs attending to each
    # other, positions running on across pairs) give another loss.
    leaky = [{k: v for k, v in b.items() if not k.endswith(("_segmentation", "_position"))} for b in packed]
    leaky_nll = sum(float(np.sum(step(params, b)["nll"])) for b in leaky) / tokens
    assert abs(leaky_nll - new["nll"]) > 1e-3 * new["nll"]
