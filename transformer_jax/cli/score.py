"""transformer-jax score --workdir=DIR [--split=test|dev] [--checkpoint=latest|best|STEP|average:N] [search flags]

Translates a split of the run's corpus with the checkpoint(s) named, prints SacreBLEU (its signature), chrF
and the paper's tokenized compound-split BLEU (labelled), and writes the translations and scores under
DIR/eval/. On a TPU pod (or several hosts) every process runs the same command with --multihost: the split
is translated over all their devices, and process 0 alone writes and prints.
"""

from absl import flags

from transformer_jax.base import storage_named
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.run_flags import define_run_flags, define_search_flags
from transformer_jax.cli.stops import interrupts_reported, signals_held

_RUN = define_run_flags(devices=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["dev", "test"], "Split to translate and score.")
_SEARCH = define_search_flags()


def main(argv: list[str]) -> None:
    del argv
    from transformer_jax.base import make_mesh, quiet_console
    from transformer_jax.evaluation import evaluate_checkpoint, format_results, write_evaluation

    quiet_console()
    done = ["nothing was written"]  # what the command has finished so far
    with user_errors(), interrupts_reported(lambda: done[0]):
        _RUN.start()
        with _RUN.opened() as run:
            options, translation = _SEARCH.options(run.config), _SEARCH.translation(run.config)  # checked first
            mesh = make_mesh()
            translation = _SEARCH.batching_for(run, options, translation, mesh, _RUN.say)
            results, hypotheses = evaluate_checkpoint(run, _RUN.checkpoint.value, _SPLIT.value, options,
                                                      mesh=mesh, **translation)
            _RUN.say(format_results(results))  # before writing them: a full disk loses no score
            done[0] = "the scores printed above; their files were not written"
            if _RUN.lead:
                with storage_named("saving the translations and scores printed above"), signals_held():
                    written = write_evaluation(run, results, hypotheses)  # both files, or neither
                    done[0] = f"the scores printed above, written with the translations to {written}"
                print(f"  hypotheses: {written}")
