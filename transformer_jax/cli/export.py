"""transformer-jax export --workdir=DIR --format=ctranslate2|hf --output=OUT [--checkpoint=...]

Writes the checkpoint(s) named as a model of another runtime, with the run's tokenizer beside it:
`ctranslate2` (a CTranslate2 model directory: the `export` extra) or `hf` (a Hugging Face MarianMTModel
directory: the `hf` extra). OUT must be absent or empty.
"""

from absl import flags

from transformer_jax.base import storage_named
from transformer_jax.cli.flag_parsing import refuse_blank
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.run_flags import define_run_flags
from transformer_jax.cli.stops import interrupts_reported
from transformer_jax.export import FORMATS

_RUN = define_run_flags()
_FORMAT = flags.DEFINE_enum("format", None, list(FORMATS), "The runtime to write the model for.")
_OUTPUT = flags.DEFINE_string("output", None, "The directory to write (absent or empty; local).")
flags.mark_flags_as_required(["format", "output"])
refuse_blank(_OUTPUT, "the directory to write the model to")
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _OUTPUT


def main(argv: list[str]) -> None:
    del argv
    from transformer_jax.base import quiet_console
    from transformer_jax.evaluation import check_outside_checkpoints
    from transformer_jax.export import export_run, export_target

    quiet_console()
    with user_errors(), interrupts_reported(lambda: f"the export at {_OUTPUT.value} was not written"):
        _RUN.start()
        target = export_target(_FORMAT.value, _OUTPUT.value)  # before any work
        check_outside_checkpoints(_RUN.workdir.value, target.directory, "--output directory")
        with _RUN.opened() as run:
            steps, params = _RUN.params(run)
            if _RUN.lead:
                with storage_named(f"writing the {target.format} model"):
                    print(f"wrote steps {steps} as a {target.format} model to {export_run(run, params, target)}")
