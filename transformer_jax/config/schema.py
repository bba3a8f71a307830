"""The full set of run settings with their defaults; the files in configs/ override them.

Every key is documented here: by the comment beside its assignment (or the lines just above it),
and model keys by TransformerConfig's docstring. docs/configuration.md's reference table is generated
from these (`python -m transformer_jax.config.reference`) and a test fails when the two differ.
Overriding a key that does not exist fails at start-up.
"""

from __future__ import annotations

import dataclasses
import json
import importlib.util
import math
from typing import Any

import ml_collections

from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.decoding.options import MAX_SEED, DecodeOptions
from transformer_jax.decoding.translate import DTYPES
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.base.files import read_text, write_atomically
from transformer_jax.base import workdir as layout

_DECODING = DecodeOptions()
_BATCHING = TranslationBatching()


def default_config() -> ml_collections.ConfigDict:
    """The paper's base model and schedule on TFDS WMT14 EN->DE."""
    config = ml_collections.ConfigDict()

    # model: every field of TransformerConfig (see model/config.py for their meaning).
    config.model = ml_collections.ConfigDict(dataclasses.asdict(TransformerConfig.preset("base")))
    # 0 takes the tokenizer's size; any other value must equal it.
    config.model.vocab_size = 0

    config.data = data = ml_collections.ConfigDict()
    data.source = "tfds"  # "builtin" | "tfds" | "text" | "tsv"
    data.path = ""  # directory with train/dev/test files for "text" and "tsv" (test optional: then scored on dev)
    data.tsv_columns = ""  # "tsv": SOURCE,TARGET column indices from 0 ("" = a header line naming the languages, else 0,1)
    data.source_lang = "en"  # translation direction: source language
    data.target_lang = "de"  # translation direction: target language
    data.tfds_train_name = "wmt14_translate/de-en"  # TFDS builder of the training split
    data.tfds_eval_name = "wmt14_translate/de-en"  # TFDS builder of dev (newstest2013) and test (newstest2014)
    data.tfds_data_dir = ""  # TFDS data_dir ("" = TFDS default)
    data.builtin_train_size = 50_000  # built-in corpus: training pairs
    data.builtin_dev_size = 1_000  # built-in corpus: dev pairs
    data.builtin_test_size = 2_000  # built-in corpus: test pairs
    data.vocab_size = 32_000  # SentencePiece vocabulary size (joint source/target)
    data.tokenizer_type = "unigram"  # SentencePiece model: "unigram" | "bpe"
    data.byte_fallback = True  # unknown characters become byte pieces instead of <unk>
    data.tokenizer_sample_size = 1_000_000  # sentences sampled across the corpus to train SentencePiece
    data.prepared = ""  # a prepared corpus (transformer-jax prepare; local or gs://); "" = <workdir>/corpus
    data.prepare_workers = 1  # processes encoding the training shards when a run prepares its own corpus

    # token slots (rows x width, padding included) per batch and side, in rows of data.max_length (of
    # data.row_width when set; of each bucket without packing). With the automatic row width, batches of
    # narrower rows have more rows, sized to hold as many real tokens as rows of max_length (data/row_width.py).
    data.tokens_per_batch = 25_000
    data.max_length = 256  # longest training pair in tokens (dev/test are never filtered)
    data.pack = True  # pack several pairs per row (segment ids); False: length buckets (more shapes, more padding)
    data.row_width = 0  # packed rows' width in tokens (0 = chosen from the corpus; longer pairs get rows of their own)
    data.eval_batch_size = _BATCHING.batch_size  # sentences per dev/test batch (rows, padded)
    data.prefetch_batches = 2  # training batches built and placed on the devices in the background, ahead of the step (0: between steps)

    config.training = training = ml_collections.ConfigDict()
    training.num_train_steps = 100_000  # optimizer updates
    training.warmup_steps = 4_000  # linear warm-up of the paper's schedule
    training.learning_rate_scale = 1.0  # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    training.peak_learning_rate = 0.0  # > 0: the same warm-up and inverse-square-root decay, peaking at this rate after warmup_steps (fairseq's inverse_sqrt; fine-tuning); 0: the paper's formula
    training.init_from = ""  # a run directory (e.g. one made by transformer-jax import) whose newest parameters, model and tokenizer a new run starts from (fine-tuning)
    training.adam_b1 = 0.9  # Adam beta1 (paper section 5.3)
    training.adam_b2 = 0.98  # Adam beta2
    training.adam_eps = 1e-9  # Adam epsilon
    training.label_smoothing = 0.1  # epsilon_ls of the label-smoothed cross-entropy (paper section 5.4)
    training.grad_clip_norm = 0.0  # global-norm clipping; 0 disables it
    training.accumulation_steps = 1  # micro-batches per update (to reach the paper's batch on fewer devices)
    training.loss_chunk_tokens = -1  # tokens per device projected to the vocabulary at once by the loss (0: the whole batch's logits; -1: 0 on CPUs, 1024 on TPUs, on GPUs as many as 1 GiB of float32 logits holds)
    training.loss_kernel = "auto"  # the projected loss's logits: "pallas" (fused kernels, none in HBM; an interpreter off TPUs), "xla" (chunks of loss_chunk_tokens), "auto" (pallas on TPUs for a model without an output bias, else xla); unused with loss_chunk_tokens 0
    training.seed = 0  # parameters, dropout and data order
    training.log_every = 100  # steps between training-metric logs
    training.eval_every = 1_000  # steps between dev-loss evaluations
    training.bleu_every = 5_000  # steps between dev-BLEU evaluations (0 = never during training)
    training.dev_bleu_sentences = 0  # dev sentences translated for dev BLEU (0 = all)
    training.checkpoint_every = 1_000  # steps between checkpoints (and one at the end)
    training.keep_checkpoints = 5  # newest checkpoints kept on disk (the best one is kept as well)
    training.max_skipped_updates = 20  # stop after this many consecutive non-finite updates
    training.wandb_project = ""  # also log the metrics to this Weights & Biases project (the wandb extra; WANDB_MODE=offline keeps them on disk); "" = off
    training.profile_steps = 0  # updates traced by jax.profiler into <workdir>/profile/ (0 = off): an XSpace for TensorBoard's profile plugin or XProf and a Perfetto trace JSON, each update marked as a step
    training.profile_skip_steps = 5  # updates of each start (or resume) before the profile begins (compiling and the first updates' warm-up left out)

    config.mesh = mesh = ml_collections.ConfigDict()
    mesh.data = -1  # data-parallel axis size (-1 = all devices not used by fsdp)
    mesh.fsdp = 1  # fully sharded data-parallel axis size (parameters sharded over it)

    config.eval = evaluation = ml_collections.ConfigDict()
    # Search defaults are DecodeOptions' (decoding/options.py), batching TranslationBatching's (data/shapes.py).
    evaluation.beam_size = _DECODING.beam_size  # beam search width for test translation and transformer-jax score (paper section 6.1)
    evaluation.alpha = _DECODING.alpha  # length penalty ((5 + len) / 6)^alpha
    evaluation.max_extra_length = _DECODING.max_extra_length  # output length limit: input length + this
    evaluation.batch_tokens = _BATCHING.batch_tokens  # source tokens per decoding batch (0: eval_batch_size rows)
    evaluation.dtype = ""  # decode in "float32"/"bfloat16" weights and matmuls ("": the model's dtype)
    evaluation.average_last = 5  # checkpoints averaged by --checkpoint=average of score, average and export (paper: 5 base, 20 big)
    return config


# The most steps a run counts: its step counter is an int32 on the devices.
MAX_INT32 = 2**31 - 1
MAX_STEP = MAX_INT32
# Settings counted in steps (the state's int32 step counter: checked with their own message) and the seed's own range.
STEP_SETTINGS = (("training", "num_train_steps"), ("training", "warmup_steps"), ("training", "checkpoint_every"),
                 ("training", "eval_every"), ("training", "bleu_every"), ("training", "log_every"))
SEED = ("training", "seed")
LOSS_KERNELS = ("auto", "pallas", "xla")  # training.loss_kernel


# Run settings that name a file or directory, "" for none (or the default place): (section, key, what to pass).
PATH_SETTINGS = (("data", "prepared", "a prepared corpus directory (transformer-jax prepare --output)"),
                 ("data", "path", "the directory of the train/dev/test files"),
                 ("data", "tfds_data_dir", "a TFDS data directory"),
                 ("training", "init_from", "the run directory to start from"))

# Run settings that must be positive (model sizes are checked by TransformerConfig itself).
POSITIVE_SETTINGS = {
    "data": ("vocab_size", "tokenizer_sample_size", "prepare_workers", "tokens_per_batch", "max_length", "eval_batch_size",
             "builtin_train_size", "builtin_dev_size", "builtin_test_size"),
    "training": ("num_train_steps", "warmup_steps", "learning_rate_scale", "accumulation_steps", "log_every",
                 "checkpoint_every", "keep_checkpoints", "max_skipped_updates", "adam_eps"),
    "eval": ("beam_size", "average_last"),
    "mesh": ("fsdp",),
}
NON_NEGATIVE_SETTINGS = {
    "data": ("row_width", "prefetch_batches"),
    "training": ("eval_every", "bleu_every", "dev_bleu_sentences", "grad_clip_norm", "label_smoothing",
                 "peak_learning_rate", "profile_steps", "profile_skip_steps"),
    "eval": ("max_extra_length", "batch_tokens"),
}


def check_run_config(config: ml_collections.ConfigDict) -> None:
    """Fail with one ConfigError line on a setting no run can use, before any data or device work."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() returned a {type(config).__name__}, not an ml_collections.ConfigDict; "
                          "start from transformer_jax.config.default_config() and change its values (see configs/)")
    _check_known_keys(config)
    for section, key, value in _numbers(config):
        if isinstance(value, float) and not math.isfinite(value):  # inf passes every "> 0" check below
            raise ConfigError(f"{section}.{key}={value!r} must be a finite number; set --config.{section}.{key}")
        # Sizes and counts become int32 on the devices (shapes, the step counter, token ids); the seed has its own
        # range.
        if isinstance(value, int) and abs(value) > MAX_INT32 and (section, key) not in (*STEP_SETTINGS, SEED):
            raise ConfigError(f"{section}.{key}={value} is larger than a run can hold (2**31 - 1: sizes and counts are "
                              f"32-bit on the devices); set --config.{section}.{key} lower")
    for section, key, meaning in PATH_SETTINGS:
        value = config[section][key]
        if isinstance(value, str) and value and not value.strip():  # "" is each one's default; spaces name nothing
            raise ConfigError(f"{section}.{key} is blank (only spaces); pass {meaning}, or leave the setting out")
    if config.training.loss_chunk_tokens < -1:
        raise ConfigError(f"training.loss_chunk_tokens={config.training.loss_chunk_tokens} must be -1 (automatic), "
                          "0 (the whole batch's logits) or a positive number of tokens")
    if config.training.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"training.wandb_project={config.training.wandb_project!r} needs Weights & Biases, which "
                          "is not installed; pip install 'transformer_jax[wandb]', or leave wandb_project empty")
    if config.training.loss_kernel not in LOSS_KERNELS:
        raise ConfigError(f"training.loss_kernel={config.training.loss_kernel!r} must be one of "
                          f"{', '.join(LOSS_KERNELS)}; set --config.training.loss_kernel")
    for limits, allowed, wording in ((POSITIVE_SETTINGS, lambda v: v > 0, "positive"),
                                     (NON_NEGATIVE_SETTINGS, lambda v: v >= 0, "zero or positive")):
        for section, keys in limits.items():
            for key in keys:
                value = config[section][key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not allowed(value):
                    raise ConfigError(f"{section}.{key}={value!r} must be {wording}; "
                                      f"set --config.{section}.{key} to a {wording} number")
    if config.data.row_width > config.data.max_length:
        raise ConfigError(f"data.row_width={config.data.row_width} is wider than data.max_length="
                          f"{config.data.max_length}; lower it, or set 0 to choose it from the corpus")
    for key in ("label_smoothing", "adam_b1", "adam_b2"):
        if not 0.0 <= config.training[key] < 1.0:
            raise ConfigError(f"training.{key}={config.training[key]!r} must be in [0, 1); "
                              f"set --config.training.{key} inside that range")
    if config.mesh.data != -1 and not (isinstance(config.mesh.data, int) and config.mesh.data > 0):
        raise ConfigError(f"mesh.data={config.mesh.data!r} must be positive, or -1 (all devices not used by "
                          "fsdp); set --config.mesh.data")
    for section, key in STEP_SETTINGS:
        if config[section][key] > MAX_STEP:  # the state's step counter is int32
            raise ConfigError(f"{section}.{key}={config[section][key]} is more steps than a run counts (2**31 - 1); "
                              f"set --config.{section}.{key} lower")
    seed = config.training.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"training.seed={seed!r} must be an integer in [0, 2**63 - 1]; set --config.training.seed")
    for check in (decode_options, translation_batching):  # the settings of the final test translation
        try:
            check(config)
        except ConfigError as error:
            setting = str(error).split("=", 1)[0]
            section = "data" if setting == "batch_size" else "eval"
            key = "eval_batch_size" if setting == "batch_size" else setting
            raise ConfigError(f"{section}.{error}; set --config.{section}.{key}") from None
    if decoding_dtype(config) not in DTYPES:
        raise ConfigError(f"eval.dtype={decoding_dtype(config)!r} is not one of {list(DTYPES)} ('' = the model's "
                          "own dtype); set --config.eval.dtype")
    # The model's own checks (d_model divisible by num_heads, ...), with the vocabulary the tokenizer will have.
    vocab_size = config.model.vocab_size or config.data.vocab_size
    model_config(config, vocab_size)
    if 2 * config.eval.beam_size > vocab_size:  # beam search keeps 2 x beam candidates among the vocabulary
        raise ConfigError(f"eval.beam_size={config.eval.beam_size} needs a vocabulary of at least "
                          f"{2 * config.eval.beam_size} pieces (it has {vocab_size}); set --config.eval.beam_size lower")


def _check_known_keys(config: ml_collections.ConfigDict) -> None:
    """A section missing, or a key the schema lacks (a typo in a config file: `num_train_step`), is an error, not
    a setting ignored."""
    import difflib

    schema = default_config()
    missing = [section for section in schema if section not in config]
    if missing:
        raise ConfigError(f"the config has no {', '.join(missing)} section; start get_config() from "
                          "transformer_jax.config.default_config() (see configs/)")
    for section, values in config.items():
        if not isinstance(values, ml_collections.ConfigDict):
            raise ConfigError(f"the config's {section!r} is not a section of settings; a run config has the "
                              f"sections {', '.join(schema)} (start get_config() from default_config())")
        if section not in schema:
            close = difflib.get_close_matches(section, list(schema), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise ConfigError(f"config section {section!r} is not one of {', '.join(schema)}{hint}; remove it from the "
                              "config file")
        for key in values:
            if key not in schema[section]:
                close = difflib.get_close_matches(key, list(schema[section]), n=1)
                hint = f' (did you mean "{section}.{close[0]}"?)' if close else ""
                raise ConfigError(f"config key {section}.{key} is not a setting{hint}; correct it in the config file "
                                  "(every key: docs/configuration.md)")


def _numbers(config: ml_collections.ConfigDict) -> list[tuple[str, str, Any]]:
    """(section, key, value) of every number of the run config's sections."""
    return [(section, key, value) for section, values in config.items() if isinstance(values, ml_collections.ConfigDict)
            for key, value in values.items() if isinstance(value, (int, float)) and not isinstance(value, bool)]


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
    """The TransformerConfig of a run, with the vocabulary size taken from (and checked against) the tokenizer."""
    return TransformerConfig.for_run(config.model, vocab_size, config.data.max_length)


def write_run_config(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Save the run's config as `<workdir>/config.json` (the evaluation commands rebuild the model from it)."""
    write_atomically(layout.run_path(workdir, layout.CONFIG), config.to_json_best_effort(indent=2))


def read_run_config(path: str, complete: bool = False) -> ml_collections.ConfigDict:
    """A run's saved config (`<workdir>/config.json`) as the full schema, every saved value in place.

    Raises CheckpointError naming the file when it is missing, not JSON, or not a run config. `complete`
    (a rerun of the settings, configs/rerun.py): a setting of the schema the file lacks is an error too, not
    the default taken without a word (a file from an older version, or edited by hand).
    """
    repair = ("restore it, or run train.py on the workdir again with the --config it was trained with "
              "(train.py writes config.json anew)")
    try:
        saved = json.loads(read_text(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist; pass the config.json a training run wrote") from None
    except (ValueError, UnicodeDecodeError) as error:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"{path} is damaged ({str(error).splitlines()[0]}); {repair}") from None
    config = default_config()
    try:
        _merge(config, saved, "")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        detail = error.args[0] if isinstance(error, KeyError) else error
        raise CheckpointError(f"{path} is not a run config of this project ({detail}); {repair}") from None
    defaults = flat_settings(config)
    missing = [key for key in defaults if key not in flat_settings(saved)] if complete else []
    if missing:
        named = ", ".join(f"{key}={defaults[key]!r}" for key in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise CheckpointError(
            f"{path} lacks {len(missing)} setting(s) a rerun needs ({named}{more}: the defaults, which the run "
            f"it records may not have used); add each with the value that run used to {path}, or start from a "
            "packaged config (--config=demo, ...) with --config.KEY=VALUE") from None
    try:
        check_run_config(config)  # a hand-edited value: name the file it is in, not a flag
    except ConfigError as error:
        raise CheckpointError(f"{path} holds a setting no run can use: {error}".split("; set --config")[0]
                              + f"; correct it in {path}, or {repair}") from None
    return config


def flat_settings(values: Any, prefix: str = "") -> dict[str, Any]:
    """{"section.key": value} of every setting in a nested dict or ConfigDict (a saved config.json, a run config),
    in order."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (dict, ml_collections.ConfigDict)):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _merge(config: ml_collections.ConfigDict, saved: Any, prefix: str) -> None:
    """Set every key of the `saved` dict in `config`; a key the schema lacks or a section gone is an error."""
    if not isinstance(saved, dict):
        raise TypeError(f"{prefix or 'the file'} is not a JSON object")
    for section in config.keys() if not prefix else ():
        if section not in saved:
            raise KeyError(f"no {section!r} section")
    for key, value in saved.items():
        if key not in config:
            raise KeyError(f"unknown key {prefix}{key}")
        if isinstance(config[key], ml_collections.ConfigDict):
            _merge(config[key], value, f"{prefix}{key}.")
        else:
            config[key] = value


def decode_options(config: ml_collections.ConfigDict) -> DecodeOptions:
    """The run's search settings: beam search with its `eval` section."""
    evaluation = config.eval
    return DecodeOptions(mode="beam", beam_size=evaluation.beam_size, alpha=evaluation.alpha,
                         max_extra_length=evaluation.max_extra_length)


def translation_batching(config: ml_collections.ConfigDict) -> TranslationBatching:
    """How the run cuts a split into translation batches: `data.eval_batch_size` sentences at most, and
    `eval.batch_tokens` source token slots (runs saved before it had none)."""
    return TranslationBatching(config.data.eval_batch_size, config.eval.get("batch_tokens", 0))


def decoding_dtype(config: ml_collections.ConfigDict) -> str:
    """The dtype the run decodes in (`eval.dtype`; "" the model's own; runs saved before it had none)."""
    return config.eval.get("dtype", "")
