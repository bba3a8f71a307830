"""transformer-jax translate --workdir=DIR [--input=FILE|-] [--checkpoint=...] [search flags] > OUT

Translates a UTF-8 text file line by line (standard input by default) and prints one translation a line,
in the input's order, to standard output. On several hosts every process runs the same command with
--multihost; process 0 prints.
"""

import sys

from absl import flags

from transformer_jax.cli.flag_parsing import refuse_blank
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.run_flags import define_run_flags, define_search_flags
from transformer_jax.cli.stops import interrupts_reported, signals_held
from transformer_jax.errors import ConfigError

_RUN = define_run_flags(devices=True)
_INPUT = flags.DEFINE_string("input", "-", "The text file to translate ('-': standard input).")
refuse_blank(_INPUT, "the file to translate, or - for standard input")
_SEARCH = define_search_flags()
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _INPUT


def check_output_encoding() -> None:
    """Translations are printed: standard output must hold every character (not so with PYTHONIOENCODING=ascii)."""
    encoding = sys.stdout.encoding or "unknown"
    try:
        "\U0001F600".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        raise ConfigError(f"standard output's encoding is {encoding}, which cannot print every translation; "
                          "set PYTHONIOENCODING=utf-8 (or a UTF-8 locale such as LANG=C.UTF-8)") from None


def main(argv: list[str]) -> None:
    del argv
    from transformer_jax.base import make_mesh, quiet_console
    from transformer_jax.evaluation import check_input, translate_file

    quiet_console()
    printed = [0]  # translations written to standard output so far
    with user_errors(), interrupts_reported(lambda: f"{printed[0]} translations printed above; nothing else was "
                                            "written"):
        multihost = _RUN.cluster is not None and _RUN.cluster.multihost.value
        check_input(_INPUT.value, named="--input=", processes=2 if multihost else 1)  # before any work
        check_output_encoding()
        _RUN.start()
        with _RUN.opened() as run:
            options, translation = _SEARCH.options(run.config), _SEARCH.translation(run.config)  # checked first
            _, params = _RUN.params(run)
            mesh = make_mesh()
            # Standard output holds the translations alone: the batching's line goes to standard error.
            translation = _SEARCH.batching_for(run, options, translation, mesh,
                                               lambda line: _RUN.say(line, file=sys.stderr))
            for line in translate_file(run, params, _INPUT.value, options, mesh=mesh, **translation):
                with signals_held():  # a stop between printing and counting would under-report
                    _RUN.say(line, flush=True)
                    printed[0] += 1
