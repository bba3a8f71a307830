"""transformer-jax plot --workdir=DIR [--curves] [--positional_encoding] [--attention=SENTENCE
                        [--attention_target=TEXT]] [--checkpoint=...] [search flags]

Draws figures as PNG files under DIR/plots/: the learning curves (loss, learning rate, BLEU from
metrics.jsonl), the positional-encoding matrix, and the attention maps of every layer and head for one
source sentence (its target: --attention_target, or the model's translation). One process draws them.
"""

from absl import flags

from transformer_jax.base import storage_named
from transformer_jax.cli.user_errors import user_errors
from transformer_jax.cli.run_flags import define_run_flags, define_search_flags
from transformer_jax.cli.stops import interrupts_reported
from transformer_jax.errors import ConfigError

_RUN = define_run_flags(cluster=False)
_CURVES = flags.DEFINE_bool("curves", False, "Plot loss, learning rate and BLEU from metrics.jsonl.")
_POSITIONS = flags.DEFINE_bool("positional_encoding", False, "Plot the positional-encoding matrix.")
_ATTENTION = flags.DEFINE_string("attention", None, "Plot the attention maps of this source sentence.")
_ATTENTION_TARGET = flags.DEFINE_string("attention_target", None,
                                        "Target for --attention (default: the model's translation).")
_SEARCH = define_search_flags(batching=False)
# The flag a bare word on the command line was probably meant for (flag_parsing.unexpected_argument names it).
BARE_WORD_FLAG = _ATTENTION


def main(argv: list[str]) -> None:
    del argv
    from transformer_jax.base import quiet_console
    from transformer_jax.evaluation import check_texts, write_figures

    quiet_console()
    written = "the figures whose paths are printed above were written; no others"
    with user_errors(), interrupts_reported(lambda: written):
        if not (_CURVES.value or _POSITIONS.value or {_ATTENTION.value, _ATTENTION_TARGET.value} != {None}):
            raise ConfigError("name the figures to draw: --curves, --positional_encoding and/or --attention=SENTENCE")
        if _ATTENTION.value is not None and not _ATTENTION.value.strip():
            raise ConfigError("--attention is empty; pass the source sentence whose attention to plot")
        # Bytes that are not UTF-8 reach argv as lone surrogates, which no tokenizer takes: refused as translate does.
        for holder in (_ATTENTION, _ATTENTION_TARGET):
            if holder.value is not None:
                check_texts([holder.value], named=f"--{holder.name}")
        _RUN.start()
        with storage_named("writing the figures"):
            for path in write_figures(_RUN.workdir.value, _RUN.checkpoint.value, _SEARCH.options,
                                      attention=_ATTENTION.value, attention_target=_ATTENTION_TARGET.value,
                                      positional_encoding=_POSITIONS.value, curves=_CURVES.value,
                                      dtype=_SEARCH.dtype.value):
                print(f"wrote {path}")
