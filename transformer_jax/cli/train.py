"""transformer-jax train --config=CONFIG --workdir=DIR [--config.KEY=VALUE ...]   (or python train.py, the same flags)

Trains a Transformer, resuming from the newest checkpoint in --workdir; at the end translates the test split
with beam search, prints SacreBLEU (with its signature) and plots the learning curves (neither with
--config.eval.test_at_end=False). CONFIG is a config file, or the name of one that ships with the package (demo,
smoke, wmt14_ende_base, wmt14_ende_big, parallel_text:DIR,SRC,TGT, rerun:FILE, finetune_opus_mt); --config_help
lists every key. A run stopped before its last step (SIGTERM, Ctrl-C) saves a checkpoint and exits 143 (130), so
that a scheduler restarts it; the same command resumes it.
"""

import jax
from absl import flags
from ml_collections import config_flags

from transformer_jax.base import quiet_console, storage_named
from transformer_jax.base import workdir as layout
from transformer_jax.checkpoints import adopt_initial_model
from transformer_jax.cli.cluster import define_cluster_flags, set_gpu_flags
from transformer_jax.cli.flag_parsing import refuse_blank
from transformer_jax.cli.run_directory import training_kept, training_workdir
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.stops import interrupts_reported
from transformer_jax.config import check_combination, check_settings, decode_options, decoding_dtype, translation_batching
from transformer_jax.evaluation import evaluate_split, plot_learning_curves, write_results
from transformer_jax.run import Trainer, assemble_run

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Run config file (see configs/); --config_help lists every key.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, tokenizer, logs and outputs.")
_CLUSTER = define_cluster_flags()  # --multihost and its three, --compilation_cache
flags.mark_flags_as_required(["config", "workdir"])
refuse_blank(_WORKDIR, "the directory for the run's checkpoints and logs")
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _WORKDIR


def train(config, workdir: str, stage: list[str]) -> None:
    """Train (resuming), then translate and score the test split and plot the learning curves (unless
    eval.test_at_end is False); `stage` says what is finished so far."""
    trainer = Trainer(assemble_run(config, workdir, checked=True))  # main checked the config
    data, model_config = trainer.data, trainer.model_config
    translation = dict(batching=translation_batching(config), dtype=decoding_dtype(config),
                       target_lang=config.data.target_lang, mesh=trainer.mesh)

    def dev_bleu(params, interrupt):
        scores, _ = evaluate_split(params, model_config, data.dev, data.tokenizer, decode_options(config),
                                   limit=config.training.dev_bleu_sentences, interrupt=interrupt, **translation)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    try:
        state = trainer.run(dev_bleu)
    finally:
        trainer.close()
    stage[0] = f"training finished at step {int(state.step)} (checkpoint saved); the test translation was not"
    if trainer.stopped_by:  # by a signal, even at the last step: the loop said where and what it saved
        raise SystemExit(128 + trainer.stop_signal)
    if not config.eval.test_at_end:
        if jax.process_index() == 0:
            print(f"training finished at step {int(state.step)}; no test translation (eval.test_at_end=False): "
                  f"transformer-jax score --workdir={workdir} scores the test split, transformer-jax plot "
                  f"--workdir={workdir} --curves draws the learning curves")
        return
    scores, hypotheses = evaluate_split(state.params, model_config, data.test, data.tokenizer, decode_options(config),
                                        show_progress=True, **translation)
    split = "dev" if data.test_is_dev else "test"  # text files without a test split: dev's scores, named so
    if jax.process_index() == 0:  # the scores first: a full disk loses none of them
        print(f"{split} SacreBLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})")
        print(f"{split} chrF {scores['chrf']:.2f}; tokenized compound-split BLEU (paper-style, "
              f"not comparable with SacreBLEU) {scores['tokenized_compound_split_bleu']:.2f}")
        finished = (f"run the same command again (training finished at step {int(state.step)} (checkpoint saved); "
                    "it translates the test split again)")
        with storage_named("saving the test translation and scores printed above", finished):
            write_results(layout.run_path(workdir, layout.FINAL_TEST), {"step": int(state.step), "split": split,
                                                                         **scores}, hypotheses)
        with storage_named("writing the learning curves", finished):
            print(f"learning curves: {plot_learning_curves(workdir)}")


def main(argv: list[str]) -> None:
    del argv
    quiet_console()
    stage = [""]  # set once training finished; before, what is on disk says (saved_so_far)
    finished = lambda: stage[0] or training_kept(_WORKDIR.value)  # noqa: E731
    # A run stopped before its last step exits 143 (SIGTERM) or 130 (Ctrl-C), so a scheduler restarts it; it resumes.
    with user_errors(), interrupts_reported(finished, resumable=True):
        _CLUSTER.use_compilation_cache(_WORKDIR.value)
        config, workdir = _CONFIG.value, _WORKDIR.value
        # The config is checked once, before any work (a bad value leaves no trace in the workdir): each setting,
        # then, with the model training.init_from fixes (fine-tuning) in place, the settings together.
        check_settings(config)
        config = adopt_initial_model(config, workdir, config_flags.get_override_values(flags.FLAGS["config"]))
        check_combination(config)
        set_gpu_flags(config.model)  # before JAX starts its backends (join)
        _CLUSTER.join(resume="Restart every process with the same command: the run resumes from its last "
                             "checkpoint.")
        with training_workdir(workdir):  # one job owns the workdir (run.lock) until it returns
            train(config, workdir, stage)

