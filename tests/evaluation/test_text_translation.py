"""Translating whole splits: order, empty lines, over-long sources, and a too-small tokenizer."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.data.encoded import encode_pairs
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.model.special_tokens import EOS_ID
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import DataError
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.evaluation.text_translation import fit_to_model, translate_encoded

SENTENCES = ["the dog sleeps", "a cat sees the dog", "the bird sings a song", "dogs and cats"] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(SENTENCES, str(tmp_path_factory.mktemp("tok") / "tokenizer.model"), vocab_size=300)


def test_over_long_sources_are_truncated_keeping_eos(caplog):
    src = np.array([[5, 6, 7, 8, 9, EOS_ID], [5, 6, EOS_ID, 0, 0, 0]], np.int32)
    with caplog.at_level(logging.WARNING):
        cut = fit_to_model(src, max_len=4)
    assert cut.shape == (2, 4)
    np.testing.assert_array_equal(cut[0], [5, 6, 7, EOS_ID])
    np.testing.assert_array_equal(cut[1], [5, 6, EOS_ID, 0])
    assert "1 source sentence(s) longer than model.max_len=4" in caplog.text
    assert fit_to_model(src, max_len=6) is src


def test_every_sentence_is_translated_in_order_and_empty_lines_stay_empty(tokenizer):
    config = TransformerConfig.preset("tiny", vocab_size=tokenizer.vocab_size, max_len=16)
    dummy = jnp.ones((1, 4), jnp.int32)
    params = Transformer(config).init(jax.random.key(0), dummy, dummy)["params"]
    lines = ["the dog sleeps", "", "a cat sees the dog " * 6, "dogs"]  # the third exceeds max_len
    encoded = encode_pairs([(line, "") for line in lines], tokenizer)
    options = DecodeOptions(mode="greedy", max_extra_length=3)
    outputs = translate_encoded(params, config, encoded, tokenizer, options, batching=TranslationBatching(2),
                                show_progress=False)
    assert len(outputs) == 4 and outputs[1] == ""
    # Each row decodes the same alone as in the batch: outputs are re-aligned with their inputs.
    alone = translate_encoded(params, config, encoded.select(np.array([3])), tokenizer, options,
                              batching=TranslationBatching(2), show_progress=False)
    assert alone == [outputs[3]]


def test_too_small_vocabulary_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"they need \d+\); set --config.data.vocab_size=\d+ or more"):
        train_tokenizer(["äöü ÄÖÜ ß é è ê ñ"] * 5 + SENTENCES, str(tmp_path / "t.model"), vocab_size=200)
    assert not (tmp_path / "t.model").exists()


class Ids:
    """Detokenizes to every output id, padding included, so equal texts mean equal tokens."""

    def decode_batch(self, ids):
        return [" ".join(map(str, row)) for row in ids]


@pytest.fixture(scope="module")
def varied_model():
    """A tiny model whose outputs end on EOS at many lengths: random weights scaled up, EOS made likelier."""
    from transformer_jax.data.encoded import EncodedPairs, Ragged

    config = TransformerConfig.preset("tiny", vocab_size=24, max_len=64, positional_encoding="learned",
                                      tie_output_embedding=False)
    dummy = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(Transformer(config).init(jax.random.key(0), dummy, dummy)["params"])
    params = jax.tree.map(lambda x: 1.5 * x, params)
    params["decoder"]["positional_encoding"]["position_embedding"] *= 10.0
    bias = params["decoder"]["output_projection"]["bias"]
    params["decoder"]["output_projection"]["bias"] = bias.at[EOS_ID].set(1.5)
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 24, size=n).tolist() + [EOS_ID] for n in rng.integers(1, 40, size=60)]
    # Targets of unrelated lengths: the former batches grouped sentences by max(source, target).
    targets = [[5] * n + [EOS_ID] for n in rng.integers(0, 60, size=60)]
    return config, params, EncodedPairs(Ragged.from_lists(sources), Ragged.from_lists(targets))


def translate_as_before(params, config, encoded, options, batch_size):
    """The former batching: batch_size sentences grouped by max(source, target) in buckets 16/32/64, PAD rows."""
    from transformer_jax.data.batching import eval_batches, restore_order
    from transformer_jax.evaluation.text_translation import _translate

    outputs, indices, rng = [], [], jax.random.key(options.seed)
    for batch in eval_batches(encoded, batch_size):
        rng, key = jax.random.split(rng)
        row_ids = np.maximum(batch["index"], 0).astype(np.uint32)
        outputs += Ids().decode_batch(np.asarray(_translate(params, batch["inputs"], key, config, options, row_ids)))
        indices += batch["index"].tolist()
    return restore_order(outputs, indices, len(encoded))


@pytest.mark.parametrize("mode", ["beam", "greedy"])
def test_batching_by_source_length_and_tokens_translates_as_before(varied_model, mode):
    config, params, encoded = varied_model
    options = DecodeOptions(mode=mode, beam_size=3, max_extra_length=8)
    before = translate_as_before(params, config, encoded, options, batch_size=16)
    after = translate_encoded(params, config, encoded, Ids(), options, batching=TranslationBatching(16, 128),
                              show_progress=False)
    strip = lambda text: text.split(" 0")[0]  # widths differ now, so the PAD after EOS does too
    assert [strip(text) for text in after] == [strip(text) for text in before]
    # Outputs end on EOS at many lengths (so batches stop at different steps), some run to the limit.
    lengths = [len(strip(text).split()) for text in after]
    ended = [strip(text).endswith(f" {EOS_ID}") or strip(text) == str(EOS_ID) for text in after]
    assert len(set(lengths)) > 5 and 10 < sum(ended) < len(after)
