"""Settings changed when a run is resumed: each change is kept, dated, in `<workdir>/config_changes.jsonl`.

`config.json` always holds the settings the run goes on with (the evaluation commands rebuild the model from
it). A resume whose settings differ from the saved ones would make it describe steps it did not take: a
warm-up or dropout rate other than the earlier updates had. So every difference that changes what a step
means is appended to the change log first, as one JSON line (the time, the step the change takes effect at,
and each setting's old and new value), and printed once. Settings that only say how far the run goes, how
often it logs, checkpoints or evaluates, how it decodes, or how the same arithmetic is laid out on the
devices change nothing that earlier steps meant; they are not recorded.

Some settings decide which arrays a checkpoint's train state holds, or their shapes or dtypes (`STATE_SETTINGS`:
the model's sizes, form and parameter dtype, clipping turned on or off). A resume with another value could not
restore the checkpoints: it is refused at start-up (`check_state_settings`), before anything is written, naming
each such setting, the value the checkpoints were saved with and the flag that resumes.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Callable

import ml_collections

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import append_text, exists, is_dir, list_names, read_text
from transformer_jax.config.schema import flat_settings
from transformer_jax.errors import ConfigError

CHANGES = layout.CONFIG_CHANGES

# Settings whose change leaves every earlier step's meaning as it was: how far and how often, not how.
UNRECORDED = frozenset({
    "training.num_train_steps", "training.log_every", "training.eval_every", "training.bleu_every",
    "training.dev_bleu_sentences", "training.checkpoint_every", "training.keep_checkpoints",
    "training.max_skipped_updates", "training.wandb_project", "training.profile_steps",
    "training.profile_skip_steps", "training.loss_chunk_tokens", "training.loss_kernel",
    "data.eval_batch_size", "data.prefetch_batches", "data.prepare_workers",
    "model.attention_backend", "model.scan_layers", "model.remat",
})
UNRECORDED_SECTIONS = ("eval.", "mesh.")


def changed_settings(saved: dict[str, Any], config: ml_collections.ConfigDict) -> dict[str, list[Any]]:
    """{"section.key": [old, new]} of the settings in `config` that differ from the `saved` config.json's and
    change what a step means (not in UNRECORDED); a key the saved file lacks counts as changed from None."""
    before, after = flat_settings(saved), flat_settings(json.loads(config.to_json_best_effort()))
    return {key: [before.get(key), value] for key, value in sorted(after.items())
            if before.get(key) != value and key not in UNRECORDED and not key.startswith(UNRECORDED_SECTIONS)}


def record_changes(workdir: str, step: int, config: ml_collections.ConfigDict) -> dict[str, list[Any]]:
    """Before `config` replaces the saved `<workdir>/config.json` at a resume from `step`: append its changes
    to `<workdir>/config_changes.jsonl` (one dated line) and return them ({} when none or nothing is saved)."""
    path = layout.run_path(workdir, layout.CONFIG)
    if not exists(path):
        return {}
    try:
        saved = json.loads(read_text(path))
    except ValueError:
        saved = {}  # damaged: every setting is recorded as new
    changes = changed_settings(saved if isinstance(saved, dict) else {}, config)
    if changes:
        line = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "step": step, "changes": changes}
        append_text(layout.run_path(workdir, CHANGES), json.dumps(line) + "\n")
    return changes


def describe(changes: dict[str, list[Any]]) -> str:
    """`changes` for one line: "training.warmup_steps 4000 -> 100, model.dropout_rate 0.1 -> 0.3"."""
    return ", ".join(f"{key} {json.dumps(old)} -> {json.dumps(new)}" for key, (old, new) in changes.items())


def _itself(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda settings: settings[key]


# The settings that shape the train state (its arrays' names, shapes and dtypes), each with what of a run's flat
# settings its part in it is: where that differs from the checkpoints', they cannot be restored (a dtype would be
# cast, and then fail its checksum). tests/run/test_setting_changes.py checks the list against the state each value
# of every model and training setting builds.
STATE_SETTINGS: dict[str, Callable[[dict[str, Any]], Any]] = {
    **{f"model.{name}": _itself(f"model.{name}") for name in (
        "num_layers", "d_model", "d_ff", "num_heads", "norm_position", "positional_encoding", "share_embeddings",
        "tie_output_embedding", "output_bias", "scan_layers", "param_dtype")},
    # A learned position table has max_len rows; sinusoidal positions are computed, not kept.
    "model.max_len": lambda settings: settings["model.max_len"] if settings["model.positional_encoding"] == "learned"
    else None,
    # Clipping is a step of the optimizer's chain with a state of its own: on or off, not its norm, shapes the state.
    "training.grad_clip_norm": lambda settings: settings["training.grad_clip_norm"] > 0,
}


def state_changes(saved: dict[str, Any], config: ml_collections.ConfigDict) -> dict[str, list[Any]]:
    """{"section.key": [old, new]} of the STATE_SETTINGS whose value in `config` gives the train state other arrays
    than the `saved` config.json's did (a setting the saved file lacks is left out: its value is not known)."""
    before, after = flat_settings(saved), flat_settings(json.loads(config.to_json_best_effort()))
    changes = {}
    for key, part in STATE_SETTINGS.items():
        try:
            if before[key] != after[key] and part(before) != part(after):
                changes[key] = [before[key], after[key]]
        except (KeyError, TypeError):  # a config.json of an older version (a setting missing), or hand-edited
            continue
    return changes


def check_state_settings(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Refuse (ConfigError) to resume the checkpoints in `workdir` with settings that give the train state other
    arrays than those they hold (`state_changes` against the saved config.json): one line naming each setting, its
    saved and new value, and the flags that resume. Nothing to check without checkpoints or a readable config.json."""
    checkpoints, path = layout.run_path(workdir, layout.CHECKPOINTS), layout.run_path(workdir, layout.CONFIG)
    if not (is_dir(checkpoints) and any(name.isdigit() for name in list_names(checkpoints)) and exists(path)):
        return
    try:
        saved = json.loads(read_text(path))
    except ValueError:
        return  # damaged: the checkpoints' own shapes are checked when they are restored
    if not isinstance(saved, dict) or not (changes := state_changes(saved, config)):
        return
    what = "optimizer state" if all(key.startswith("training.") for key in changes) else "parameters"
    why = (" (turning clipping on or off adds or removes a step of the optimizer, with a state of its own)"
           if "training.grad_clip_norm" in changes else "")
    resume = " ".join(f"--config.{key}={old}" for key, (old, _) in changes.items())
    raise ConfigError(f"{describe(changes)} would change the {what} that the checkpoints in {workdir} hold{why}, so "
                      f"the run cannot resume with {'it' if len(changes) == 1 else 'them'}; pass {resume} to resume, "
                      "or start a new run in another --workdir")
