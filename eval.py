"""Evaluate or use a trained run.

  python eval.py --workdir=DIR [--checkpoint=latest|best|STEP|average:N] [--split=test|dev]
                 [--beam_size=4 --alpha=0.6 --max_extra_length=50] [--mode=beam|greedy|sample]
  python eval.py --workdir=DIR --translate=FILE|-        # translate text line by line
  python eval.py --workdir=DIR --checkpoint=average:5 --write_averaged=PATH
  python eval.py --workdir=DIR --plot_attention="the dog jumped over the wall" [--plot_attention_target=TEXT]
  python eval.py --workdir=DIR --plot_positional_encoding --plot_curves   # PNGs under DIR/plots/
"""

import os
import sys

from absl import app, flags

from transformer_jax.cli import parse_flags, user_errors
from transformer_jax.data import DataError
from transformer_jax.eval_run import (evaluate_checkpoint, format_results, plot_attention,
                                      plot_positional_encoding, translate_lines)
from transformer_jax.plots import plot_learning_curves
from transformer_jax.restore import checkpoint_params, open_run, select_steps, write_params

_WORKDIR = flags.DEFINE_string("workdir", None, "The --workdir of a training run.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "latest", "latest, best, a step, average:N (mean of the last N), or average (the run's eval.average_last).")
_SPLIT = flags.DEFINE_enum("split", "test", ["dev", "test"], "Split to translate and score.")
_MODE = flags.DEFINE_enum("mode", "beam", ["beam", "greedy", "sample"], "Decoding mode.")
_BEAM = flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's eval.beam_size).")
_ALPHA = flags.DEFINE_float("alpha", None, "Length penalty alpha (default: the run's eval.alpha).")
_EXTRA = flags.DEFINE_integer("max_extra_length", None, "Output length limit: input length + this.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed (--mode=sample).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature (--mode=sample).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens; 0 = all (--mode=sample).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = all (--mode=sample).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences decoded together.")
_TRANSLATE = flags.DEFINE_string("translate", None, "Translate this file ('-' = standard input) to stdout.")
_AVERAGED = flags.DEFINE_string("write_averaged", None, "Write the --checkpoint parameters here (Orbax).")
_ATTENTION = flags.DEFINE_string("plot_attention", None, "Plot the attention maps of this source sentence.")
_ATTENTION_TARGET = flags.DEFINE_string(
    "plot_attention_target", None, "Target for --plot_attention (default: the model's translation).")
_POSITIONS = flags.DEFINE_bool("plot_positional_encoding", False, "Plot the positional-encoding matrix.")
_CURVES = flags.DEFINE_bool("plot_curves", False, "Plot loss, learning rate and BLEU from metrics.jsonl.")
flags.mark_flag_as_required("workdir")


def decoding_options(run_config) -> dict:
    """Decoding settings: the flags where given, else the run's eval section."""
    evaluation = run_config.eval
    options = {"mode": _MODE.value, "batch_size": _BATCH.value,
               "max_extra_length": evaluation.max_extra_length if _EXTRA.value is None else _EXTRA.value}
    if _MODE.value == "beam":
        options.update(beam_size=_BEAM.value or evaluation.beam_size,
                       alpha=evaluation.alpha if _ALPHA.value is None else _ALPHA.value)
    if _MODE.value == "sample":
        options.update(seed=_SEED.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value)
    return options


def translate_text(run, options: dict) -> None:
    """Print the translation of each line of --translate (a file, or standard input with '-')."""
    if _TRANSLATE.value != "-" and not os.path.isfile(_TRANSLATE.value):
        raise DataError(f"--translate file {_TRANSLATE.value} does not exist; pass a text file or -")
    params = checkpoint_params(run, select_steps(run.checkpointer, _CHECKPOINT.value, run.config.eval.average_last))
    interactive = _TRANSLATE.value == "-"
    source = sys.stdin if interactive else open(_TRANSLATE.value, encoding="utf-8")
    for translation in translate_lines(run, params, source, options, 1 if interactive else _BATCH.value):
        print(translation, flush=True)


def make_plots() -> None:
    """Write the figures the --plot_* flags ask for under <workdir>/plots/ and print their paths."""
    if _ATTENTION_TARGET.value is not None and _ATTENTION.value is None:
        raise ValueError("--plot_attention_target needs --plot_attention=SOURCE_SENTENCE")
    paths = [plot_learning_curves(_WORKDIR.value)] if _CURVES.value else []
    if _ATTENTION.value is not None or _POSITIONS.value:
        run = open_run(_WORKDIR.value)
        try:
            steps = select_steps(run.checkpointer, _CHECKPOINT.value, run.config.eval.average_last)
            params = checkpoint_params(run, steps)
            if _ATTENTION.value is not None:
                paths += plot_attention(run, params, steps, _ATTENTION.value, _ATTENTION_TARGET.value,
                                        decoding_options(run.config))
            if _POSITIONS.value:
                paths.append(plot_positional_encoding(run, params, steps[-1]))
        finally:
            run.checkpointer.close()
    for path in paths:
        print(f"wrote {path}")


def main(argv: list[str]) -> None:
    del argv
    with user_errors((ValueError,)):
        if _CURVES.value or _POSITIONS.value or {_ATTENTION.value, _ATTENTION_TARGET.value} != {None}:
            make_plots()
            return
        run = open_run(_WORKDIR.value)
        try:
            options = decoding_options(run.config)
            if _AVERAGED.value:
                steps = select_steps(run.checkpointer, _CHECKPOINT.value, run.config.eval.average_last)
                write_params(checkpoint_params(run, steps), _AVERAGED.value)
                print(f"wrote the parameters of steps {steps} to {_AVERAGED.value}")
            elif _TRANSLATE.value:
                translate_text(run, options)
            else:
                print(format_results(evaluate_checkpoint(run, _CHECKPOINT.value, _SPLIT.value, options)))
        finally:
            run.checkpointer.close()


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
