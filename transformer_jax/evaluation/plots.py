"""Figures of a run: attention maps, the positional-encoding matrix and learning curves, as PNG files.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no global
state) and written atomically under `<workdir>/plots/`; images that fit TensorBoard also go to
`<workdir>/tensorboard`.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from transformer_jax.errors import DataError
from transformer_jax.evaluation.introspection import ATTENTION_TITLES
from transformer_jax.evaluation.outputs import write_together
from transformer_jax.base.files import is_file, read_text
from transformer_jax.base.log_records import read_records
from transformer_jax.base.tensorboard import tensorboard_writer
from transformer_jax.base import workdir as layout

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _agg_figure(**options: Any) -> Figure:
    """A matplotlib Figure on the Agg canvas; matplotlib is imported only when a figure is drawn (it
    takes ~0.3 s, and eval.py's scoring and train.py's steps draw none)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**options)
    FigureCanvasAgg(figure)
    return figure

LEARNING_CURVE_PANELS = ("loss", "learning rate", "dev BLEU")
# Panels are this many inches per token, within bounds that keep 6 layers x 16 heads readable.
_INCHES_PER_TOKEN, _MIN_PANEL, _MAX_PANEL = 0.11, 1.4, 2.6


def attention_figure(
    weights_LxHxTxS: np.ndarray, query_tokens: Sequence[str], key_tokens: Sequence[str], title: str
) -> Figure:
    """A layers x heads grid of heatmaps (rows: queries, columns: keys; 0 white, 1 dark)."""
    layers, heads, queries, keys = weights_LxHxTxS.shape
    if (queries, keys) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights are {queries}x{keys} but there are "
                         f"{len(query_tokens)}x{len(key_tokens)} tokens")
    panel = float(np.clip(_INCHES_PER_TOKEN * max(queries, keys), _MIN_PANEL, _MAX_PANEL))
    font = float(np.clip(panel * 72 / max(queries, keys) * 0.8, 3, 8))
    # Margins in inches from the longest token and the title's lines (a layout engine would take
    # ~10x longer on 6 x 16 panels): a character is about 0.6 em wide.
    left, bottom = (0.3 + 0.6 * font / 72 * max(map(len, tokens), default=1)
                    for tokens in (query_tokens, key_tokens))
    top = 0.3 + 0.17 * (title.count("\n") + 1)
    gap = 0.3  # between rows of panels, for their titles
    height = layers * panel + (layers - 1) * gap + bottom + top
    width = max(heads * panel + left + 0.15, 0.6 * 9 / 72 * max(map(len, title.splitlines())))
    figure = _agg_figure(figsize=(width, height))
    grid = figure.subplots(layers, heads, squeeze=False, gridspec_kw=dict(
        left=left / width, right=1 - 0.15 / width, bottom=bottom / height, top=1 - top / height,
        wspace=0.08, hspace=gap / panel))
    for layer in range(layers):
        for head in range(heads):
            axes = grid[layer, head]
            axes.imshow(weights_LxHxTxS[layer, head], cmap="Blues", vmin=0.0, vmax=1.0,
                        interpolation="nearest", aspect="auto")
            axes.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=7)
            axes.tick_params(length=0)
            # Tokens on the outer panels only: labels on all of them would cost most of the drawing time.
            axes.set_xticks(range(keys) if layer == layers - 1 else [])
            axes.set_yticks(range(queries) if head == 0 else [])
            if layer == layers - 1:
                axes.set_xticklabels(key_tokens, rotation=90, fontsize=font)
            if head == 0:
                axes.set_yticklabels(query_tokens, fontsize=font)
    figure.suptitle(title, fontsize=9)
    return figure


def positional_encoding_figure(matrix_PxD: np.ndarray, kind: str) -> Figure:
    """The [positions, d_model] matrix as a heatmap, and a few of its dimensions against position."""
    positions, d_model = matrix_PxD.shape
    figure = _agg_figure(figsize=(12, 4.5), layout="constrained")
    heatmap, curves = figure.subplots(1, 2, width_ratios=(3, 2))
    limit = float(np.abs(matrix_PxD).max()) or 1.0  # 1 for sinusoids; learned tables are smaller
    image = heatmap.imshow(matrix_PxD, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto",
                           interpolation="nearest")
    heatmap.set(title=f"{kind} positional encoding ({positions} positions x {d_model} dimensions)",
                xlabel="dimension", ylabel="position")
    figure.colorbar(image, ax=heatmap, shrink=0.8)
    # Wavelengths grow geometrically with the dimension: four (even, sine) dimensions from fast to slow.
    for dimension in sorted({2 * (d_model // denominator // 2) for denominator in (16, 8, 4, 2)}):
        curves.plot(np.arange(positions), matrix_PxD[:, dimension], label=f"dim {dimension}", linewidth=1)
    curves.set(title="some dimensions against position", xlabel="position", ylabel="value")
    curves.legend(fontsize=7, loc="lower left")
    return figure


def learning_curves_figure(
    records: Sequence[dict[str, Any]], test_bleu: tuple[int, float] | None = None
) -> Figure:
    """Panels LEARNING_CURVE_PANELS against step, from metrics.jsonl records and a final (step, test BLEU)."""
    figure = _agg_figure(figsize=(15, 4.2), layout="constrained")
    loss, learning_rate, bleu = figure.subplots(1, 3, sharex=True)
    for split, style in (("train", "-"), ("dev", "o-")):
        _plot_metric(loss, records, split, "loss", f"{split} loss", style)
    _plot_metric(learning_rate, records, "train", "learning_rate", "learning rate", "-")
    _plot_metric(bleu, records, "dev", "bleu", "dev SacreBLEU", "o-")
    if not bleu.lines:
        bleu.text(0.5, 0.5, "no dev BLEU in metrics.jsonl\n(training.bleu_every = 0)", ha="center",
                  va="center", transform=bleu.transAxes, color="gray")
    if test_bleu is not None:
        bleu.plot([test_bleu[0]], [test_bleu[1]], "*", markersize=12, label="test SacreBLEU (final)")
    for axes, title in zip((loss, learning_rate, bleu), LEARNING_CURVE_PANELS):
        axes.set(title=title, xlabel="step")
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend(fontsize=8)
    loss.set_ylabel("label-smoothed cross-entropy")
    learning_rate.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    return figure


def _plot_metric(axes: Any, records: Sequence[dict[str, Any]], split: str, key: str, label: str,
                 style: str) -> None:
    points = sorted((r["step"], r[key]) for r in records if r.get("split") == split and key in r)
    if points:
        steps, values = zip(*points)
        axes.plot(steps, values, style, label=label, markersize=4, linewidth=1.2)


def png_bytes(figure: Figure, dpi: int = 100) -> bytes:
    """The figure rendered as PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def save_png(figure: Figure, path: str) -> str:
    """Write the figure to `path` atomically (a reader never sees half a PNG); returns `path`.

    A failure (a full disk) is the OSError naming `path`, and leaves no temporary behind.
    """
    write_together({path: png_bytes(figure)})
    return path


def add_to_tensorboard(workdir: str, images: dict[str, Figure], step: int) -> None:
    """Add each figure as an image `tag` at `step` to `<workdir>/tensorboard`."""
    writer = tensorboard_writer(workdir)
    try:
        for tag, figure in images.items():
            canvas = figure.canvas  # the Agg canvas `_agg_figure` attached
            canvas.draw()
            rgb_HxWx3 = np.asarray(canvas.buffer_rgba())[..., :3]
            writer.add_image(tag, rgb_HxWx3, step, dataformats="HWC")
    finally:
        writer.close()


def plot_learning_curves(workdir: str) -> str:
    """Draw `<workdir>/metrics.jsonl` (and test_final.json's BLEU) to `<workdir>/plots/learning_curves.png`.

    Returns the PNG's path. Raises DataError when the run has logged no metrics yet, CheckpointError
    when a file stands where the plots folder goes.
    """
    metrics_path = layout.run_path(workdir, layout.METRICS)
    records = read_records(metrics_path) if is_file(metrics_path) else []
    if not records:
        raise DataError(f"no metrics in {metrics_path}; train first (train.py) or pass the run's --workdir")
    layout.check_layout(workdir, [layout.PLOTS])
    final_path = layout.run_path(workdir, layout.FINAL_TEST + ".json")
    test_bleu = None
    if is_file(final_path):
        final = json.loads(read_text(final_path))
        test_bleu = (int(final["step"]), float(final["bleu"]))
    figure = learning_curves_figure(records, test_bleu)
    return save_png(figure, layout.run_path(workdir, layout.PLOTS, layout.LEARNING_CURVES))


def attention_title(kind: str, detail: str) -> str:
    """A figure title naming the attention kind (in the paper's words) and where the pair came from."""
    # A '$' pair would be read as mathtext: escape it so sentences show as written.
    return f"{ATTENTION_TITLES[kind]}: {detail}".replace("$", r"\$")
