"""Evaluate or use a trained run.

  python eval.py --workdir=DIR [--checkpoint=latest|best|STEP|average:N] [--split=test|dev]
                 [--beam_size=4 --alpha=0.6 --max_extra_length=50] [--mode=beam|greedy|sample]
                 [--dtype=float32|bfloat16] [--cpu_devices=N]
  python eval.py --workdir=DIR --translate=FILE|-        # translate text line by line
  python eval.py --workdir=DIR --checkpoint=average:5 --write_averaged=PATH
  python eval.py --workdir=DIR [--checkpoint=...] --export=ctranslate2:OUT   # a CTranslate2 model directory
  python eval.py --workdir=DIR --plot_attention="the dog jumped over the wall" [--plot_attention_target=TEXT]
  python eval.py --workdir=DIR --plot_positional_encoding --plot_curves   # PNGs under DIR/plots/

On a TPU pod (or several hosts), every process runs the same command with --multihost (and, without
auto-detection, --coordinator_address, --num_processes, --process_id): the split is translated over
all their devices, and process 0 alone writes files and prints.
"""

import signal

ARRIVED: list[int] = []  # SIGTERM/SIGINT during the imports below (seconds), acted on by interrupts_reported
for _stop in (signal.SIGTERM, signal.SIGINT):
    if signal.getsignal(_stop) is not signal.SIG_IGN:  # a background job's ignored SIGINT stays ignored
        signal.signal(_stop, lambda number, frame: ARRIVED.append(number))


import sys

import jax
from absl import flags

from transformer_jax.base import make_mesh, quiet_console, set_cpu_devices
from transformer_jax.checkpoints import checkpoint_params, open_run, select_steps, write_params
from transformer_jax.cli import (define_cluster_flags, interrupts_reported, run_command, signals_held, storage_named,
                                 user_errors)
from transformer_jax.config import decode_options, decoding_dtype, translation_batching
from transformer_jax.decoding import DecodeOptions
from transformer_jax.errors import ConfigError
from transformer_jax.evaluation import (evaluate_checkpoint, format_results, translate_file, write_evaluation,
                                       write_figures)
from transformer_jax.evaluation.outputs import check_new_output, check_outside_checkpoints
from transformer_jax.export import export_run, export_target

_WORKDIR = flags.DEFINE_string("workdir", None, "The --workdir of a training run.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "latest", "latest, best, a step, average:N (mean of the last N), or average (the run's eval.average_last).")
_SPLIT = flags.DEFINE_enum("split", "test", ["dev", "test"], "Split to translate and score.")
_MODE = flags.DEFINE_enum("mode", None, ["beam", "greedy", "sample"], "Decoding mode (default: beam).")
_BEAM = flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's eval.beam_size).")
_ALPHA = flags.DEFINE_float("alpha", None, "Length penalty alpha (default: the run's eval.alpha).")
_EXTRA = flags.DEFINE_integer("max_extra_length", None, "Output length limit: input length + this.")
_SEED = flags.DEFINE_integer("seed", None, "Sampling seed (--mode=sample; default 0).")
_TEMPERATURE = flags.DEFINE_float("temperature", None, "Sampling temperature, > 0 (--mode=sample; default 1).")
_TOP_K = flags.DEFINE_integer("top_k", None, "Sample among the k most likely tokens; 0 = all (--mode=sample; default 0).")
_TOP_P = flags.DEFINE_float("top_p", None, "Nucleus sampling mass in (0, 1]; 1 = all (--mode=sample; default 1).")
_BATCH = flags.DEFINE_integer("batch_size", None, "Sentences decoded together (default: the run's data.eval_batch_size).")
_BATCH_TOKENS = flags.DEFINE_integer(
    "batch_tokens", None, "Source token slots per batch of a split, at most --batch_size rows (default: the run's "
    "eval.batch_tokens; 0 = --batch_size sentences).")
_DTYPE = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16"], "Decode with weights and matmuls in this dtype (default: the run's "
    "eval.dtype, else the model's).")
_TRANSLATE = flags.DEFINE_string("translate", None, "Translate this file ('-' = standard input) to stdout.")
_AVERAGED = flags.DEFINE_string("write_averaged", None, "Write the --checkpoint parameters here (Orbax).")
_EXPORT = flags.DEFINE_string(
    "export", None, "FORMAT:DIR: write the --checkpoint model for another runtime (ctranslate2), tokenizer beside it.")
_ATTENTION = flags.DEFINE_string("plot_attention", None, "Plot the attention maps of this source sentence.")
_ATTENTION_TARGET = flags.DEFINE_string(
    "plot_attention_target", None, "Target for --plot_attention (default: the model's translation).")
_POSITIONS = flags.DEFINE_bool("plot_positional_encoding", False, "Plot the positional-encoding matrix.")
_CURVES = flags.DEFINE_bool("plot_curves", False, "Plot loss, learning rate and BLEU from metrics.jsonl.")
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices", None, "On a CPU backend, devices that split each batch's rows (0: one per core, at most 8; "
    "default: the count XLA_FLAGS or JAX_NUM_CPU_DEVICES set, else 0). GPU/TPU backends are not affected.")
_CLUSTER = define_cluster_flags()  # --multihost and its three, --compilation_cache
flags.mark_flag_as_required("workdir")


def decoding_options(run_config) -> DecodeOptions:
    """The run's search settings (its eval section), overridden by the flags given (each for its mode only)."""
    mode = _MODE.value or "beam"
    for flag, belongs in ((_BEAM, "beam"), (_ALPHA, "beam"), (_SEED, "sample"), (_TEMPERATURE, "sample"),
                          (_TOP_K, "sample"), (_TOP_P, "sample")):
        if flag.value is not None and mode != belongs:
            raise ConfigError(f"--{flag.name} applies to --mode={belongs}, not --mode={mode}; drop it, or pass "
                              f"--mode={belongs}")
    return decode_options(run_config).replace(
        mode=_MODE.value, beam_size=_BEAM.value, alpha=_ALPHA.value, max_extra_length=_EXTRA.value,
        seed=_SEED.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value)


def check_split_flag() -> None:
    """--split names the split to score; given with a command that scores no split it would be ignored."""
    commands = [f"--{flag.name}" for flag in (_TRANSLATE, _AVERAGED, _EXPORT, _ATTENTION) if flag.value is not None]
    commands += [f"--{flag.name}" for flag in (_POSITIONS, _CURVES) if flag.value]
    if flags.FLAGS["split"].present and commands:
        raise ConfigError(f"--split chooses the split to score, which {commands[0]} does not do; drop --split, "
                          f"or score the split in a command of its own")


def check_output_encoding() -> None:
    """Translations are printed: standard output must hold every character (not so with PYTHONIOENCODING=ascii)."""
    encoding = sys.stdout.encoding or "unknown"
    try:
        "\U0001F600".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        raise ConfigError(f"standard output's encoding is {encoding}, which cannot print every translation; "
                          "set PYTHONIOENCODING=utf-8 (or a UTF-8 locale such as LANG=C.UTF-8)") from None


def translation(run_config) -> dict:
    """How the split or file is batched and the dtype it is decoded in: the run's, overridden by the flags."""
    return dict(batching=translation_batching(run_config).replace(batch_size=_BATCH.value,
                                                                 batch_tokens=_BATCH_TOKENS.value),
                dtype=decoding_dtype(run_config) if _DTYPE.value is None else _DTYPE.value)


def main(argv: list[str]) -> None:
    del argv
    quiet_console()
    printed = [0]  # translations written to stdout so far (--translate)
    done = ["nothing was written"]  # what a scoring command has finished so far

    def finished() -> str:
        if _TRANSLATE.value:
            return f"{printed[0]} translations printed above; nothing else was written"
        return done[0]

    with user_errors(), interrupts_reported(finished, arrived=ARRIVED):
        _CLUSTER.use_compilation_cache(_WORKDIR.value)
        check_split_flag()
        if _TRANSLATE.value:
            check_output_encoding()
        set_cpu_devices(_CPU_DEVICES.value)  # before JAX starts its backends
        _CLUSTER.join()
        # Every process does the same work (restoring and translating are collective); process 0 reports it.
        lead = not _CLUSTER.multihost.value or jax.process_index() == 0
        say = print if lead else lambda *args, **kwargs: None
        if _CURVES.value or _POSITIONS.value or {_ATTENTION.value, _ATTENTION_TARGET.value} != {None}:
            if _CLUSTER.multihost.value and jax.process_count() > 1:
                raise ConfigError("the --plot_* figures are drawn by one process; run them without --multihost")
            if _ATTENTION.value is not None and not _ATTENTION.value.strip():
                raise ConfigError("--plot_attention is empty; pass the source sentence whose attention to plot")
            with storage_named("writing the figures"):
                for path in write_figures(_WORKDIR.value, _CHECKPOINT.value, decoding_options,
                                          attention=_ATTENTION.value, attention_target=_ATTENTION_TARGET.value,
                                          positional_encoding=_POSITIONS.value, curves=_CURVES.value,
                                          dtype=_DTYPE.value):
                    print(f"wrote {path}")
            return
        # The outputs' places are checked before any work: one output a command, each flag naming something.
        given = [flag for flag in (_TRANSLATE, _AVERAGED, _EXPORT) if flag.value is not None]
        for flag in given:
            if not flag.value.strip():
                raise ConfigError(f"--{flag.name} is empty; pass what it names (see --help)")
        if len(given) > 1:
            raise ConfigError(f"--{given[0].name} and --{given[1].name} are two commands; run them one at a time")
        target = export_target(_EXPORT.value) if _EXPORT.value else None
        if target:
            check_outside_checkpoints(_WORKDIR.value, target.directory, "--export directory")
        if _AVERAGED.value:
            check_new_output(_WORKDIR.value, _AVERAGED.value, "--write_averaged path")
        run = open_run(_WORKDIR.value)
        try:
            options, batching_and_dtype = decoding_options(run.config), translation(run.config)  # checked first
            if not (_AVERAGED.value or _TRANSLATE.value or target):
                results, hypotheses = evaluate_checkpoint(run, _CHECKPOINT.value, _SPLIT.value, options,
                                                          mesh=make_mesh(), **batching_and_dtype)
                say(format_results(results))  # before writing them: a full disk loses no score
                done[0] = "the scores printed above; their files were not written"
                if lead:
                    with storage_named("saving the translations and scores printed above"), signals_held():
                        written = write_evaluation(run, results, hypotheses)  # both files, or neither
                        done[0] = f"the scores printed above, written with the translations to {written}"
                    say(f"  hypotheses: {written}")
                return
            steps = select_steps(run.checkpointer, _CHECKPOINT.value, run.config.eval.average_last)
            params = checkpoint_params(run, steps)
            if target:
                if lead:
                    with storage_named(f"writing the {target.format} model"):
                        say(f"wrote steps {steps} as a {target.format} model to {export_run(run, params, target)}")
            elif _AVERAGED.value:
                with storage_named("writing the averaged parameters"):
                    write_params(params, _AVERAGED.value)  # every process takes part; Orbax writes from process 0
                say(f"wrote the parameters of steps {steps} to {_AVERAGED.value}")
            else:
                for line in translate_file(run, params, _TRANSLATE.value, options, mesh=make_mesh(),
                                           **batching_and_dtype):
                    with signals_held():  # a stop between printing and counting would under-report
                        say(line, flush=True)
                        printed[0] += 1
        finally:
            run.checkpointer.close()


if __name__ == "__main__":
    run_command(main)
