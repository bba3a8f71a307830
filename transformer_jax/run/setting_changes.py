"""Settings changed when a run is resumed: each change is kept, dated, in `<workdir>/config_changes.jsonl`.

`config.json` always holds the settings the run goes on with (the evaluation commands rebuild the model from
it). A resume whose settings differ from the saved ones would make it describe steps it did not take: a
warm-up or dropout rate other than the earlier updates had. So every difference that changes what a step
means is appended to the change log first, as one JSON line (the time, the step the change takes effect at,
and each setting's old and new value), and printed once. Settings that only say how far the run goes, how
often it logs, checkpoints or evaluates, how it decodes, or how the same arithmetic is laid out on the
devices change nothing that earlier steps meant; they are not recorded.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import ml_collections

from transformer_jax.base import workdir as layout
from transformer_jax.base.files import append_text, exists, read_text
from transformer_jax.config.schema import flat_settings

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
