"""transformer-jax average --workdir=DIR --output=PATH [--checkpoint=average|average:N|...]

Writes the parameters of the checkpoint(s) named, averaged (the paper averages the last 5 checkpoints of
the base model, 20 of the big one; `average` takes the run's eval.average_last), as one Orbax checkpoint at
PATH, outside the run's checkpoints: train with --config.training.init_from=PATH, or read it with
transformer_jax.checkpoints.read_params.
"""

from absl import flags

from transformer_jax.base import storage_named
from transformer_jax.cli.flag_parsing import refuse_blank
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.run_flags import define_run_flags
from transformer_jax.cli.stops import interrupts_reported

_RUN = define_run_flags(checkpoint="average")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the parameters (a new Orbax checkpoint directory).")
flags.mark_flag_as_required("output")
refuse_blank(_OUTPUT, "the path to write the parameters to")
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _OUTPUT


def main(argv: list[str]) -> None:
    del argv
    from transformer_jax.base import quiet_console
    from transformer_jax.checkpoints import write_params
    from transformer_jax.evaluation import check_new_output

    quiet_console()
    with user_errors(), interrupts_reported(lambda: f"nothing was written at {_OUTPUT.value}"):
        _RUN.start()
        check_new_output(_RUN.workdir.value, _OUTPUT.value, "--output path")  # before any work
        with _RUN.opened() as run:
            steps, params = _RUN.params(run)
            with storage_named("writing the averaged parameters"):
                write_params(params, _OUTPUT.value)  # every process takes part; Orbax writes from process 0
            _RUN.say(f"wrote the parameters of steps {steps} to {_OUTPUT.value}")
