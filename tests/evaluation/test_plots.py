"""Figures: the plotted attention weights are the model's own, the files appear with the expected panels."""

import json
import pathlib
import struct
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest

from runs import copy_run
from transformer_jax import Transformer, sinusoidal_encoding
from transformer_jax.model.special_tokens import BOS_ID
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import DataError
from transformer_jax.evaluation.attention_plots import attention_pair, plot_slug
from transformer_jax.checkpoints.saved_run import open_run
from transformer_jax.checkpoints.selection import checkpoint_params
from transformer_jax.evaluation.introspection import (
    attention_maps,
    collect_attention,
    positional_encoding_matrix,
)
from transformer_jax.evaluation.plots import (
    LEARNING_CURVE_PANELS,
    add_to_tensorboard,
    attention_figure,
    learning_curves_figure,
    plot_learning_curves,
    positional_encoding_figure,
)
from transformer_jax.evaluation.text_translation import translate_lines

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    """`python script args...` from the repository root, as a user runs it."""
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def random_model():
    """A tiny Transformer with random parameters, run on the fused backend (which sows nothing)."""
    from transformer_jax import TransformerConfig

    config = TransformerConfig.preset("tiny", vocab_size=50, max_len=32, attention_backend="fused")
    source = np.array([5, 6, 7, 8, 9, 3], np.int32)
    decoder_input = np.array([BOS_ID, 13, 14, 15], np.int32)
    params = Transformer(config).init(jax.random.key(1), source[None], decoder_input[None])["params"]
    return config, nn.unbox(params), source, decoder_input


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_attention_maps_are_the_models_weights(random_model):
    config, params, source, decoder_input = random_model
    maps = attention_maps(config, params, source, decoder_input)
    S, T, L, H = len(source), len(decoder_input), config.num_layers, config.num_heads
    assert maps["encoder_self_attention"].shape == (L, H, S, S)
    assert maps["decoder_self_attention"].shape == (L, H, T, T)
    assert maps["encoder_decoder_attention"].shape == (L, H, T, S)
    for weights in maps.values():
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    causal = maps["decoder_self_attention"]
    assert np.all(causal[..., np.triu_indices(T, k=1)[0], np.triu_indices(T, k=1)[1]] == 0.0)
    assert np.all(np.diagonal(causal, axis1=-2, axis2=-1) > 0)

    # Layer 1 of the encoder by hand, in float64: softmax((x Wq + bq)(x Wk)^T / sqrt(d_k)).
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = p["shared_embedding"]["embedding"][source] * np.sqrt(config.d_model)
    x = x + np.asarray(sinusoidal_encoding(jnp.arange(S), config.d_model), np.float64)
    attention = p["encoder"]["layer_0"]["self_attention"]
    q = np.einsum("sd,dhk->hsk", x, attention["query"]["kernel"]) + attention["query"]["bias"][:, None]
    k = np.einsum("sd,dhk->hsk", x, attention["key"]["kernel"])
    expected = softmax(np.einsum("hsk,htk->hst", q, k) / np.sqrt(config.head_dim))
    np.testing.assert_allclose(maps["encoder_self_attention"][0], expected, atol=2e-5)


def test_attention_figure_plots_those_weights_per_layer_and_head(random_model):
    config, params, source, decoder_input = random_model
    weights = attention_maps(config, params, source, decoder_input)["encoder_decoder_attention"]
    queries, keys = [f"q{i}" for i in range(len(decoder_input))], [f"k{i}" for i in range(len(source))]
    figure = attention_figure(weights, queries, keys, "encoder-decoder attention")
    panels = figure.axes
    assert len(panels) == config.num_layers * config.num_heads
    for index, axes in enumerate(panels):
        layer, head = divmod(index, config.num_heads)
        assert axes.get_title() == f"layer {layer + 1}, head {head + 1}"
        np.testing.assert_array_equal(axes.images[0].get_array(), weights[layer, head])
    assert [t.get_text() for t in panels[0].get_yticklabels()] == queries
    assert [t.get_text() for t in panels[-1].get_xticklabels()] == keys
    with pytest.raises(ValueError, match="tokens"):
        attention_figure(weights, keys, queries, "axes swapped")


def test_attention_maps_of_a_scanned_stack_equal_the_unscanned_ones(random_model):
    config, params, source, decoder_input = random_model
    from transformer_jax.model.stacks import scanned_layout

    scanned = attention_maps(config.replace(scan_layers=True), scanned_layout(params), source, decoder_input)
    for kind, weights in attention_maps(config, params, source, decoder_input).items():
        np.testing.assert_allclose(scanned[kind], weights, atol=1e-6)


def test_collect_attention_stacks_layers_in_numeric_order():
    def sown(value: float, shape: tuple[int, ...]) -> dict:
        return {"attention_weights": (np.full((1, 1) + shape, value),)}

    layers = range(12)  # "layer_10" sorts before "layer_2" as text
    intermediates = {
        "encoder": {f"layer_{i}": {"self_attention": sown(i, (3, 3))} for i in layers},
        "decoder": {f"layer_{i}": {"self_attention": sown(100 + i, (2, 2)),
                                   "cross_attention": sown(200 + i, (2, 3))} for i in layers},
    }
    maps = collect_attention(intermediates)
    assert maps["encoder_self_attention"][:, 0, 0, 0].tolist() == list(layers)
    assert maps["decoder_self_attention"][:, 0, 0, 0].tolist() == [100 + i for i in layers]
    assert maps["encoder_decoder_attention"].shape == (12, 1, 2, 3)


def test_positional_encoding_matrix_and_figure(random_model):
    config, params, source, decoder_input = random_model
    matrix = positional_encoding_matrix(config)
    np.testing.assert_array_equal(matrix, sinusoidal_encoding(jnp.arange(config.max_len), config.d_model))
    figure = positional_encoding_figure(matrix, "sinusoidal")
    np.testing.assert_array_equal(figure.axes[0].images[0].get_array(), matrix)
    assert figure.axes[0].get_xlabel() == "dimension" and figure.axes[0].get_ylabel() == "position"

    learned = config.replace(positional_encoding="learned")
    learned_params = Transformer(learned).init(jax.random.key(2), source[None], decoder_input[None])["params"]
    table = nn.unbox(learned_params)["encoder"]["positional_encoding"]["position_embedding"]
    np.testing.assert_array_equal(positional_encoding_matrix(learned, learned_params, length=10), table[:10])


def write_metrics(workdir: pathlib.Path) -> None:
    records = [{"step": s, "split": "train", "loss": 10.0 / s, "learning_rate": 1e-3 * s} for s in (1, 2, 3, 4)]
    records += [{"step": 2, "split": "dev", "loss": 4.0, "bleu": 5.0},
                {"step": 4, "split": "dev", "loss": 3.0, "bleu": 9.0}]
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (workdir / "metrics.jsonl").write_text(lines + '{"step": 5, "spl')  # a line cut short by a crash
    (workdir / "test_final.json").write_text(json.dumps({"step": 4, "bleu": 11.5}))


def test_learning_curves_from_metrics_jsonl(tmp_path):
    write_metrics(tmp_path)
    path = pathlib.Path(plot_learning_curves(str(tmp_path)))
    assert path == tmp_path / "plots" / "learning_curves.png"
    assert matplotlib.image.imread(path).ndim == 3

    from transformer_jax.base.log_records import read_records

    figure = learning_curves_figure(read_records(str(tmp_path / "metrics.jsonl")), (4, 11.5))
    loss, learning_rate, bleu = figure.axes
    assert [axes.get_title() for axes in figure.axes] == list(LEARNING_CURVE_PANELS)
    lines = {line.get_label(): line for axes in figure.axes for line in axes.lines}
    np.testing.assert_allclose(lines["train loss"].get_ydata(), [10.0, 5.0, 10 / 3, 2.5])
    np.testing.assert_allclose(lines["dev loss"].get_xdata(), [2, 4])
    np.testing.assert_allclose(lines["learning rate"].get_ydata(), [1e-3, 2e-3, 3e-3, 4e-3])
    np.testing.assert_allclose(lines["dev SacreBLEU"].get_ydata(), [5.0, 9.0])
    np.testing.assert_allclose(lines["test SacreBLEU (final)"].get_xydata(), [[4, 11.5]])


def test_learning_curves_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="no metrics in .*metrics.jsonl; train first"):
        plot_learning_curves(str(tmp_path))


def image_tags(tensorboard_dir: pathlib.Path) -> set[str]:
    """Tags of the image summaries in the TensorBoard event files (TFRecord framing, read by hand)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in tensorboard_dir.glob("events.out.tfevents.*"):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            tags |= {value.tag for value in event.summary.value if value.HasField("image")}
    return tags


def test_figures_added_within_one_second_keep_each_others_event_files(tmp_path, monkeypatch):
    """tensorboardX names event files by the second: a second writer must not truncate the first's file."""
    figure = positional_encoding_figure(np.asarray(sinusoidal_encoding(jnp.arange(16), 8)), "sinusoidal")
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)  # both writers open in the same second
    add_to_tensorboard(str(tmp_path), {"first": figure}, 1)
    add_to_tensorboard(str(tmp_path), {"second": figure}, 1)
    monkeypatch.undo()
    assert image_tags(tmp_path / "tensorboard") == {"first", "second"}


@pytest.fixture(scope="module")
def trained(script_trained_run, tmp_path_factory):
    """This module's copy of the tiny run trained by train.py (6 steps)."""
    return copy_run(script_trained_run, tmp_path_factory.mktemp("plots_run") / "workdir")


def test_eval_plots_attention_positions_and_curves_of_a_trained_run(trained):
    result = run("eval.py", f"--workdir={trained}", '--plot_attention=the dog sleeps .',
                 "--plot_positional_encoding", "--plot_curves")
    assert result.returncode == 0, result.stderr[-3000:]
    written = [pathlib.Path(line.removeprefix("wrote ")) for line in result.stdout.splitlines()
               if line.startswith("wrote ")]
    kinds = ("encoder_self_attention", "decoder_self_attention", "encoder_decoder_attention")
    expected = [trained / "plots" / "learning_curves.png"]
    slug = plot_slug("the dog sleeps .")
    assert slug.startswith("the_dog_sleeps.") and slug != plot_slug("the dog sleeps on the mat .")
    expected += [trained / "plots" / f"attention.{slug}.step_6.{kind}.png" for kind in kinds]
    expected += [trained / "plots" / "positional_encoding.png"]
    assert written == expected
    for path in written:
        assert matplotlib.image.imread(path).shape[2] in (3, 4)
    assert {f"attention/{kind}" for kind in kinds} | {"positional_encoding"} <= image_tags(trained / "tensorboard")


def test_attention_target_is_the_models_translation_or_the_given_one(trained):
    run_ = open_run(str(trained))
    try:
        params = checkpoint_params(run_, [6])
        options = DecodeOptions(mode="greedy", max_extra_length=4)
        source_ids, decoder_input, origin = attention_pair(run_, params, "the dog sleeps .", None, options)
        translation = next(translate_lines(run_, params, ["the dog sleeps ."], options))
        assert decoder_input[0] == BOS_ID and run_.tokenizer.decode(decoder_input) == translation
        assert origin == "the model's translation by greedy decoding"

        _, given, origin = attention_pair(run_, params, "the dog sleeps .", "der Hund schläft .", options)
        assert given.tolist() == [BOS_ID] + run_.tokenizer.encode("der Hund schläft .")
        assert origin == "given by --attention_target"
    finally:
        run_.checkpointer.close()


def test_plot_errors_are_one_line(tmp_path, trained):
    missing = run("eval.py", f"--workdir={tmp_path}", "--plot_curves")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "error: no metrics in" in missing.stderr
    orphan = run("eval.py", f"--workdir={trained}", "--plot_attention_target=der Hund")
    assert orphan.returncode == 2 and "error: --attention_target needs --attention" in orphan.stderr
