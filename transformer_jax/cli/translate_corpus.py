"""transformer-jax translate-corpus --workdir=DIR --input=FILES [--output_dir=OUT] [--shard_lines=N] [search flags]

Translates whole corpora (millions of lines: back-translation, distillation) resumably. --input names files or
globs (local or gs://; repeat it, or separate them by commas); each output is `<input>.<suffix>` beside it, or
in --output_dir, line for line with its input, and `<output>.json` records the settings and counts (lines, empty
lines, lines cut to the model's max_len). Each file is read in shards of --shard_lines lines; each finished shard
is kept in `<output>.parts/`, so the same command, run again after a stop of any kind (SIGTERM, SIGKILL, a
preempted VM), goes on from the first unfinished shard, and the output is the same bytes as an uninterrupted
run's over the input as it is at the end; a shard whose input lines changed since (an edited input, another file of
the same name), whose file is damaged, or that another job or place wrote is translated again, an input edited while
the job runs stops it before the join (the same command goes on), and a checkpoint replaced in --workdir is refused.
Nothing at an output's place that the job did not make (a file, a link, a folder) is replaced. One job owns an output
at a time (`<output>.lock`, as a run owns its workdir). With --multihost every process takes its own shards (on
storage they all reach: gs://, or a shared file system) and translates them on its own devices.
"""

import os
import sys

from absl import flags

from transformer_jax.base import Claim, holding
from transformer_jax.cli.flag_parsing import refuse_blank
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.run_flags import define_run_flags, define_search_flags
from transformer_jax.cli.stops import interrupts_reported
from transformer_jax.errors import ConfigError

_RUN = define_run_flags(devices=True)
_INPUT = flags.DEFINE_multi_string("input", None, "Text files to translate, or globs (local or gs://); repeat the "
                                   "flag or separate them by commas.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Write the outputs here (default: beside each input).")
_SUFFIX = flags.DEFINE_string("suffix", None, "The outputs' suffix: <input name>.<suffix> (default: the run's "
                              "target language; an empty one is refused).")
_SHARD_LINES = flags.DEFINE_integer("shard_lines", 10_000, "Lines a shard: the unit of work that is kept, shared "
                                    "out among processes, and redone at most after a stop.")
_SEARCH = define_search_flags()
flags.mark_flag_as_required("input")
refuse_blank(_INPUT, "the files (or globs) to translate")
refuse_blank(_OUTPUT_DIR, "a directory, or leave it out to write beside each input")
refuse_blank(_SUFFIX, "a name such as de, or leave it out for the run's target language")
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _INPUT


def main(argv: list[str]) -> None:
    del argv
    import dataclasses

    import jax

    from transformer_jax.base import is_local, quiet_console
    from transformer_jax.checkpoints import run_config_of
    from transformer_jax.evaluation import Translator, corpus_translation

    quiet_console()
    kept = "the shards finished so far are kept in each output's .parts folder; the same command goes on from them"
    with user_errors(), interrupts_reported(lambda: kept):
        if _SHARD_LINES.value < 1:
            raise ConfigError(f"--shard_lines={_SHARD_LINES.value} must be at least 1")
        patterns = [part.strip() for value in _INPUT.value for part in value.split(",") if part.strip()]
        if not patterns:  # a value such as ",": refuse_blank lets no blank one through
            raise ConfigError("--input is empty; pass the files (or globs) to translate")
        _RUN.start()
        # The inputs and the outputs' places are checked from the run's config alone, before the model is loaded: a
        # refused command line says so at once, however large the checkpoint.
        workdir = _RUN.workdir.value
        suffix = run_config_of(workdir).data.target_lang if _SUFFIX.value is None else _SUFFIX.value
        files = corpus_translation.plan_files(corpus_translation.expand_inputs(patterns), _OUTPUT_DIR.value, suffix)
        translator = Translator(workdir, _RUN.checkpoint.value, dtype=_SEARCH.dtype.value)
        try:
            run_config = translator.run.config
            options = _SEARCH.options(run_config)
            translator.batching = _SEARCH.translation(run_config)["batching"]  # None: sized for the devices
            batching = translator.batching_for(options)
            settings = {"workdir": os.path.abspath(workdir) if is_local(workdir) else workdir,
                        "checkpoint": _RUN.checkpoint.value, "steps": translator.steps,
                        "model": translator.fingerprint(), "search": dataclasses.asdict(options),
                        "dtype": translator.dtype, "batching": dataclasses.asdict(batching),
                        "shard_lines": _SHARD_LINES.value}
            say = (lambda line: print(line, file=sys.stderr, flush=True)) if _RUN.lead else (lambda line: None)
            claims = [Claim(item.output + corpus_translation.LOCK, item.output, "translate-corpus job", "--output_dir")
                      for item in files]
            refused = "an output is in use by another translate-corpus job (process 0 names it)"
            # A place that takes no file (faults_of) is one line on every process, before an output is claimed.
            with corpus_translation.faults_of(files), holding(claims, refused):
                records = corpus_translation.translate_corpus(
                    translator, files, settings, dataclasses.asdict(options), shard_lines=_SHARD_LINES.value,
                    process_index=jax.process_index(), process_count=jax.process_count(), say=say)
        finally:
            translator.close()
        for record in records:
            _RUN.say(f"{record['input']}: {record['lines']} lines translated ({record['empty']} empty, "
                     f"{record['truncated']} cut to the model's max_len)")
