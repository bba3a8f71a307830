"""Every run setting, declared once: its key, default, type, bound or choices, and meaning (`SETTINGS`).

`default_config()` builds the run config from the declaration; `config/schema.py` checks a config against it and
`config/reference.py` writes docs/configuration.md and `--config_help` from it. The model's settings are
TransformerConfig's fields, the search's DecodeOptions' and the translation batches' TranslationBatching's (each a
`declared` field: default, meaning, bound, and choices from its Literal type); their rows here read those fields, and
data.source and data.tokenizer_type take the choices their readers refuse others by (data/sources.py SOURCES,
data/tokenizer.py TOKENIZER_TYPES), so a limit is written in one place.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import ml_collections

from transformer_jax.base import FRACTION, NON_NEGATIVE, POSITIVE, Bound, declared_limits
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.data.sources import SOURCES
from transformer_jax.data.tokenizer import TOKENIZER_TYPES
from transformer_jax.decoding.options import SEED, DecodeOptions
from transformer_jax.decoding.translate import DTYPES
from transformer_jax.model.config import TransformerConfig

# The most steps a run counts: its step counter is an int32 on the devices (sizes and counts are too).
MAX_INT32 = 2**31 - 1
MAX_STEP = MAX_INT32


@dataclasses.dataclass(frozen=True)
class Setting:
    """One run setting: `key` ("section.name"), its default (whose type every value must have: a float setting
    takes an int too), its meaning, and what it admits: a `bound` on numbers, or `choices`.

    `steps`: counted in optimizer steps (at most MAX_STEP, the state's step counter). `names`: a file or directory
    ("" for none), what to pass for it; a value of spaces alone names nothing and is refused.
    """

    key: str
    default: Any
    help: str  # noqa: A003 - fairseq's and argparse's name for a setting's meaning
    bound: Bound | None = None
    choices: tuple[Any, ...] = ()
    steps: bool = False
    names: str = ""

    @property
    def section(self) -> str:
        """The config section the setting is in ("data")."""
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        """The setting's name inside its section ("vocab_size")."""
        return self.key.partition(".")[2]

    @property
    def type(self) -> type:  # noqa: A003 - the setting's type, as ml_collections infers it from the default
        """The type its values have (that of the default)."""
        return type(self.default)


def declared_setting(owner: type, key: str, help: str | None = None, field: str = "") -> Setting:  # noqa: A002
    """The run setting `key` ("eval.beam_size") that a field of dataclass `owner` declares (`field`, else the one
    named as `key`'s name): its default, bound and choices, and its meaning (or `help`, the run's own words for it)."""
    name = field or key.partition(".")[2]
    declaration = next(declaration for declaration in dataclasses.fields(owner) if declaration.name == name)
    _, bound, choices = declared_limits(owner)[name]
    return Setting(key, declaration.default, declaration.metadata["help"] if help is None else help, bound, choices)


def _model_settings() -> tuple[Setting, ...]:
    """TransformerConfig's fields as the `model` section; a run's vocabulary size defaults to the tokenizer's."""
    settings = [declared_setting(TransformerConfig, f"model.{field.name}")
                for field in dataclasses.fields(TransformerConfig)]
    return tuple(dataclasses.replace(
        setting, default=0, bound=Bound(0, wording="0 (the tokenizer's size) or a positive integer", short=">= 0"),
        help=setting.help + " 0 takes the tokenizer's size; any other value must equal it.")
        if setting.key == "model.vocab_size" else setting for setting in settings)


SETTINGS: tuple[Setting, ...] = _model_settings() + (
    Setting("data.source", "tfds", "where the corpus comes from: the built-in corpus, TFDS, or data.path's text "
            "or tsv files.", choices=SOURCES),
    Setting("data.path", "", 'directory with train/dev/test files for "text" and "tsv" (test optional: then scored on '
            "dev).", names="the directory of the train/dev/test files"),
    Setting("data.tsv_columns", "", '"tsv": SOURCE,TARGET column indices from 0 ("" = a header line naming the '
            "languages, else 0,1)."),
    Setting("data.source_lang", "en", "translation direction: source language."),
    Setting("data.target_lang", "de", "translation direction: target language."),
    Setting("data.tfds_train_name", "wmt14_translate/de-en", "TFDS builder of the training split."),
    Setting("data.tfds_eval_name", "wmt14_translate/de-en", "TFDS builder of dev (newstest2013) and test "
            "(newstest2014)."),
    Setting("data.tfds_data_dir", "", 'TFDS data_dir ("" = TFDS default).', names="a TFDS data directory"),
    Setting("data.builtin_train_size", 50_000, "built-in corpus: training pairs.", POSITIVE),
    Setting("data.builtin_dev_size", 1_000, "built-in corpus: dev pairs.", POSITIVE),
    Setting("data.builtin_test_size", 2_000, "built-in corpus: test pairs.", POSITIVE),
    Setting("data.vocab_size", 32_000, "SentencePiece vocabulary size (joint source/target).", POSITIVE),
    Setting("data.tokenizer_type", "unigram", "SentencePiece model type.", choices=TOKENIZER_TYPES),
    Setting("data.byte_fallback", True, "unknown characters become byte pieces instead of <unk>."),
    Setting("data.tokenizer_sample_size", 1_000_000, "sentences sampled across the corpus to train SentencePiece.",
            POSITIVE),
    Setting("data.prepared", "", 'a prepared corpus (transformer-jax prepare; local or gs://); "" = <workdir>/corpus.',
            names="a prepared corpus directory (transformer-jax prepare --output)"),
    Setting("data.prepare_workers", 1, "processes encoding the training shards when a run prepares its own corpus.",
            POSITIVE),
    Setting("data.tokens_per_batch", 25_000,
            "token slots (rows x width, padding included) per batch and side, in rows of data.max_length (of "
            "data.row_width when set; of each bucket without packing). With the automatic row width, batches of "
            "narrower rows have more rows, sized to hold as many real tokens as rows of max_length "
            "(data/row_width.py).", POSITIVE),
    Setting("data.max_length", 256, "longest training pair in tokens (dev/test are never filtered).", POSITIVE),
    Setting("data.pack", True, "pack several pairs per row (segment ids); False: length buckets (more shapes, more "
            "padding)."),
    Setting("data.row_width", 0, "packed rows' width in tokens (0 = chosen from the corpus; longer pairs get rows of "
            "their own).", NON_NEGATIVE),
    declared_setting(TranslationBatching, "data.eval_batch_size", "sentences per dev/test batch (rows, padded).",
                     field="batch_size"),
    Setting("data.prefetch_batches", 2, "training batches built and placed on the devices in the background, ahead "
            "of the step (0: between steps).", NON_NEGATIVE),
    Setting("training.num_train_steps", 100_000, "optimizer updates.", POSITIVE, steps=True),
    Setting("training.warmup_steps", 4_000, "linear warm-up of the paper's schedule.", POSITIVE, steps=True),
    Setting("training.learning_rate_scale", 1.0, "multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).",
            POSITIVE),
    Setting("training.peak_learning_rate", 0.0, "> 0: the same warm-up and inverse-square-root decay, peaking at "
            "this rate after warmup_steps (fairseq's inverse_sqrt; fine-tuning); 0: the paper's formula.",
            NON_NEGATIVE),
    Setting("training.init_from", "", "a run directory (e.g. one made by transformer-jax import) whose newest "
            "parameters, model and tokenizer a new run starts from (fine-tuning).",
            names="the run directory to start from"),
    Setting("training.adam_b1", 0.9, "Adam beta1 (paper section 5.3).", FRACTION),
    Setting("training.adam_b2", 0.98, "Adam beta2.", FRACTION),
    Setting("training.adam_eps", 1e-9, "Adam epsilon.", POSITIVE),
    Setting("training.label_smoothing", 0.1, "epsilon_ls of the label-smoothed cross-entropy (paper section 5.4).",
            FRACTION),
    Setting("training.grad_clip_norm", 0.0, "global-norm clipping; 0 disables it.", NON_NEGATIVE),
    Setting("training.accumulation_steps", 1, "micro-batches per update (to reach the paper's batch on fewer "
            "devices).", POSITIVE),
    Setting("training.loss_chunk_tokens", -1, "tokens per device projected to the vocabulary at once by the loss "
            "(0: the whole batch's logits; -1: 0 on CPUs, 1024 on TPUs, on GPUs as many as 1 GiB of float32 logits "
            "holds).", Bound(0, also=(-1,), wording="-1 (automatic), 0 (the whole batch's logits) or a positive "
                             "number of tokens", short="-1, or >= 0")),
    Setting("training.loss_kernel", "auto", 'the projected loss\'s logits: "pallas" (fused kernels, none in HBM; an '
            'interpreter off TPUs), "xla" (chunks of loss_chunk_tokens), "auto" (pallas on TPUs for a model without '
            "an output bias, else xla); unused with loss_chunk_tokens 0.", choices=("auto", "pallas", "xla")),
    Setting("training.seed", 0, "parameters, dropout and data order.",
            SEED),
    Setting("training.log_every", 100, "steps between training-metric logs.", POSITIVE, steps=True),
    Setting("training.eval_every", 1_000, "steps between dev-loss evaluations (logged; one at a checkpoint's step "
            "goes with that checkpoint and ranks it).", NON_NEGATIVE, steps=True),
    Setting("training.bleu_every", 5_000, "steps between dev-BLEU evaluations (0 = never during training).",
            NON_NEGATIVE, steps=True),
    Setting("training.dev_bleu_sentences", 0, "dev sentences translated for dev BLEU (0 = all).", NON_NEGATIVE),
    Setting("training.checkpoint_every", 1_000, "steps between checkpoints (and one at the end); they alone decide "
            "when a checkpoint is saved: an evaluation at a checkpoint's step goes with it, and the best checkpoint "
            "is chosen among those that carry one.", POSITIVE, steps=True),
    Setting("training.max_updates_in_flight", 2, "the most updates dispatched to the devices and not yet finished: "
            "the host's lead over them, which a stop (SIGTERM) waits for before its checkpoint (1: the host waits for "
            "each update before dispatching the next).", Bound(1, 1000, wording="an integer in [1, 1000]",
                                                               short="[1, 1000]")),
    Setting("training.stop_grace_seconds", 30.0, "seconds a scheduler gives a stopped run between SIGTERM and SIGKILL "
            "(GKE's terminationGracePeriodSeconds): once a checkpoint write has been timed, one line says when the "
            "updates in flight and a checkpoint write cannot fit (0 = no check).", NON_NEGATIVE),
    Setting("training.keep_checkpoints", 5, "newest checkpoints kept on disk (the best one by the dev metric, "
            "among those saved at an evaluated step, is kept as well).",
            POSITIVE),
    Setting("training.max_skipped_updates", 20, "stop after this many consecutive non-finite updates.", POSITIVE),
    Setting("training.wandb_project", "", "also log the metrics to this Weights & Biases project (the wandb extra; "
            'WANDB_MODE=offline keeps them on disk); "" = off.'),
    Setting("training.profile_steps", 0, "updates traced by jax.profiler into <workdir>/profile/ (0 = off): an "
            "XSpace for TensorBoard's profile plugin or XProf and a Perfetto trace JSON, each update marked as a "
            "step.", NON_NEGATIVE),
    Setting("training.profile_skip_steps", 5, "updates of each start (or resume) before the profile begins "
            "(compiling and the first updates' warm-up left out).", NON_NEGATIVE),
    Setting("mesh.data", -1, "data-parallel axis size (-1 = all devices not used by fsdp).",
            Bound(0, open_low=True, also=(-1,), wording="positive, or -1 (all devices not used by fsdp)",
                  short="-1, or > 0")),
    Setting("mesh.fsdp", 1, "fully sharded data-parallel axis size (parameters sharded over it).", POSITIVE),
    # The search's defaults and limits are DecodeOptions' (decoding/options.py), the batching's TranslationBatching's.
    declared_setting(DecodeOptions, "eval.beam_size", "beam search width for test translation and transformer-jax "
                     "score (paper section 6.1)."),
    declared_setting(DecodeOptions, "eval.alpha", "length penalty ((5 + len) / 6)^alpha; 0 turns it off."),
    declared_setting(DecodeOptions, "eval.max_extra_length", "output length limit: input length + this."),
    declared_setting(TranslationBatching, "eval.batch_tokens", "source tokens per decoding batch (0: "
                     "eval_batch_size rows)."),
    Setting("eval.dtype", "", 'the dtype decoding runs its weights and matmuls in ("": the model\'s dtype).',
            choices=DTYPES),
    Setting("eval.test_at_end", True, "when training ends, translate and score the test split (<workdir>/test_final) "
            "and plot the learning curves; False: a finished run ends at its last checkpoint (transformer-jax score "
            "and plot do both when asked, e.g. on the averaged checkpoints)."),
    Setting("eval.average_last", 5, "checkpoints averaged by --checkpoint=average of score, average and export "
            "(paper: 5 base, 20 big).", POSITIVE),
)
SECTIONS = tuple(dict.fromkeys(setting.section for setting in SETTINGS))  # model, data, training, mesh, eval


def default_config() -> ml_collections.ConfigDict:
    """The paper's base model and schedule on TFDS WMT14 EN->DE: every setting at its declared default."""
    config = ml_collections.ConfigDict({section: {} for section in SECTIONS})
    for setting in SETTINGS:
        config[setting.section][setting.name] = setting.default
    return config


def nearest_key(given: str) -> str | None:
    """The run setting `given` ("training.warmup", "trainin.seed", "warmup_steps") most likely meant: its name in
    another section (or with none given), else a close name in its section (its name misspelt, too), else one
    holding its name, else a close name anywhere (None: nothing near). The command line's unknown keys and a config
    file's are both answered with it."""
    section, dot, name = given.partition(".")
    section, name = (section, name) if dot else ("", given)
    if section and section not in SECTIONS:
        section = next(iter(difflib.get_close_matches(section, SECTIONS, n=1)), "")
    exact = [setting.key for setting in SETTINGS if setting.name == name]
    if exact:
        return exact[0]
    mine = {setting.name: setting.key for setting in SETTINGS if setting.section == section}
    close = difflib.get_close_matches(name, list(mine), n=1)
    if close:
        return mine[close[0]]
    holding = [key for other, key in mine.items() if name and name in other]
    if holding:
        return holding[0]
    close = difflib.get_close_matches(name, [setting.name for setting in SETTINGS], n=1)
    return next(setting.key for setting in SETTINGS if setting.name == close[0]) if close else None
