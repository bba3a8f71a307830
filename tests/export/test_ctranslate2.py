"""The CTranslate2 export: on small trained models (post-LN and pre-LN), CTranslate2 decodes as we do."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID
from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.sampling import greedy_decode
from transformer_jax.errors import ConfigError
from transformer_jax.export import export_ctranslate2, export_target
from transformer_jax.model.masks import PAD_ID
from transformer_jax.training.state import create_train_state
from transformer_jax.training.step import train_step

ctranslate2 = pytest.importorskip("ctranslate2")

VOCAB_SIZE, MAX_WORDS, EXTRA = 24, 8, 3
VOCABULARY = ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, VOCAB_SIZE)]


def reversal_batch(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    """Sentences of 2..MAX_WORDS random words + EOS; the target is the source reversed (+ EOS)."""
    src = np.zeros((size, MAX_WORDS + 1), np.int32)
    targets, target_inputs = np.zeros_like(src), np.zeros_like(src)
    for row, length in enumerate(rng.integers(2, MAX_WORDS + 1, size)):
        words = rng.integers(4, VOCAB_SIZE, length)
        src[row, :length + 1] = [*words, EOS_ID]
        targets[row, :length + 1] = [*words[::-1], EOS_ID]
        target_inputs[row, :length + 1] = [BOS_ID, *words[::-1]]
    return {"inputs": src, "target_inputs": target_inputs, "targets": targets}


def train_and_export(norm_position: str, directory: str) -> tuple:
    """A 1-layer model trained 150 steps on reversal (partly learned: beam search and greedy disagree at
    times), exported to `directory`: (params, config, CTranslate2 translator)."""
    config = TransformerConfig.preset("tiny", vocab_size=VOCAB_SIZE, num_layers=1, d_model=32, d_ff=64, num_heads=2,
                                      max_len=32, dropout_rate=0.0, norm_position=norm_position)
    state = create_train_state(Transformer(config), optax.adam(3e-3), seed=0)
    step = jax.jit(train_step, static_argnums=2, donate_argnums=0)
    rng = np.random.default_rng(0)
    for _ in range(150):
        state, _ = step(state, reversal_batch(rng, 64), 0.0)
    params = nn.meta.unbox(state.params)
    export_ctranslate2(params, config, VOCABULARY, directory)
    return params, config, ctranslate2.Translator(directory, device="cpu", intra_threads=2)


@pytest.fixture(scope="module", params=["post", "pre"])
def trained(request, tmp_path_factory):
    """train_and_export for a post-LN and a pre-LN model."""
    return train_and_export(request.param, str(tmp_path_factory.mktemp("ct2") / "model"))


def words(ids: np.ndarray) -> list[str]:
    return [VOCABULARY[t] for t in ids if t not in (PAD_ID, EOS_ID)]


def ct2_decode(translator, src: np.ndarray, **options) -> list:
    """CTranslate2's best hypothesis per row, with our output length limit: source tokens (EOS included) + EXTRA."""
    results = []
    for row in src:
        source_length = int((row != PAD_ID).sum())
        results.append(translator.translate_batch(
            [words(row)], max_decoding_length=source_length + EXTRA, min_decoding_length=0, return_scores=True,
            **options)[0])
    return results


def test_greedy_output_equals_ours_token_for_token(trained):
    params, config, translator = trained
    src = reversal_batch(np.random.default_rng(1), 48)["inputs"]
    ours = np.asarray(greedy_decode(params, config, src, max_extra_length=EXTRA))
    theirs = ct2_decode(translator, src, beam_size=1)
    assert [r.hypotheses[0] for r in theirs] == [words(row) for row in ours]


def test_beam_4_output_equals_ours_and_scores_agree(trained):
    """Length penalty off in both (alpha 0, length_penalty 0): the two searches are then the same algorithm.

    With alpha > 0 they differ by formula: ours is GNMT's ((5 + |Y|) / 6)^alpha with EOS counted,
    CTranslate2's |Y|^alpha without EOS, and it stops after beam_size finished hypotheses.
    """
    params, config, translator = trained
    src = reversal_batch(np.random.default_rng(2), 48)["inputs"]
    tokens, scores = beam_search(params, config, src, beam_size=4, alpha=0.0, max_extra_length=EXTRA)
    greedy = np.asarray(greedy_decode(params, config, src, max_extra_length=EXTRA))
    theirs = ct2_decode(translator, src, beam_size=4, length_penalty=0.0)
    ours = [words(row) for row in np.asarray(tokens)[:, 0]]
    same = [r.hypotheses[0] == hypothesis for r, hypothesis in zip(theirs, ours)]
    # A difference may only be a tie that float rounding breaks the other way.
    np.testing.assert_allclose([r.scores[0] for r in theirs], np.asarray(scores)[:, 0], atol=1e-4)
    assert sum(same) >= len(same) - 1, [i for i, s in enumerate(same) if not s]
    assert any(hypothesis != words(row) for hypothesis, row in zip(ours, greedy)), "beam never beats greedy here"


def test_beam_4_with_length_penalties_equals_ours_on_nearly_every_sentence(trained):
    """alpha 0.6: ours divides by ((5 + |Y|) / 6)^alpha with EOS counted and stops when no live hypothesis
    can still win; CTranslate2 divides by |Y|^alpha without EOS and stops after beam_size finished ones."""
    params, config, translator = trained
    src = reversal_batch(np.random.default_rng(2), 48)["inputs"]
    tokens, _ = beam_search(params, config, src, beam_size=4, alpha=0.6, max_extra_length=EXTRA)
    theirs = ct2_decode(translator, src, beam_size=4, length_penalty=0.6)
    same = sum(r.hypotheses[0] == words(row) for r, row in zip(theirs, np.asarray(tokens)[:, 0]))
    # Measured: 43 of 48 (post-LN) and 48 of 48 (pre-LN); the differences come from the formulas.
    assert same >= 0.8 * len(src), f"{same} of {len(src)} equal"


def test_export_refuses_a_non_empty_directory_and_unknown_formats(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="not empty"):
        export_target("ctranslate2", str(tmp_path / "model"))
    with pytest.raises(ConfigError, match="unknown"):
        export_target("onnx", str(tmp_path / "other"))
    with pytest.raises(ConfigError, match="--output directory is empty"):
        export_target("ctranslate2", " ")
