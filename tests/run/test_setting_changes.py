"""Settings changed at a resume: the declaration of those that shape the train state, checked against the state each
value builds, and the refusal of a resume with one of them changed."""

import json

import jax
import pytest

from transformer_jax.base.sharding import make_mesh
from transformer_jax.config.settings import SETTINGS
from transformer_jax.errors import ConfigError
from transformer_jax.run.programs import build_run
from transformer_jax.run.setting_changes import STATE_SETTINGS, check_state_settings, state_changes

VOCABULARY = 500  # the tiny run's tokenizer
# Settings of the model and training sections with no other value to try here, and why none shapes the state.
NOT_TRIED = {
    "model.vocab_size": "the tokenizer's size (any other value is refused at start-up)",
    "model.attention_backend": "the attention's kernel; the state is built with einsum whatever it is",
    "training.init_from": "read at a fresh start only (a run directory to take parameters from)",
    "training.wandb_project": "where metrics go",
}


def other_value(key: str, value):
    """A value of setting `key` other than `value` that a run on CPU can build."""
    setting = next(setting for setting in SETTINGS if setting.key == key)
    if setting.choices:
        return next(choice for choice in setting.choices if choice != value)
    if isinstance(value, bool):
        return not value
    if key.endswith("dtype"):
        return "bfloat16" if value != "bfloat16" else "float32"
    if isinstance(value, int):
        return 2 * value if value > 0 else 1  # 2 heads of 32 -> 4 of 32, a width of 32 -> 64: both divide
    return value / 2 if value else 0.5


def state_arrays(config) -> dict[str, tuple]:
    """{path: (shape, dtype)} of every array of the train state `config` builds (what a checkpoint holds)."""
    state = build_run(config, make_mesh(-1, 1), VOCABULARY).abstract_state
    return {jax.tree_util.keystr(path): (leaf.shape, str(leaf.dtype))
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}


def test_the_settings_that_shape_the_train_state_are_those_declared(run_config):
    """Every model and training setting, changed alone: the checkpoint's arrays change exactly when STATE_SETTINGS
    says so (a new setting that changes them, undeclared, fails here). About 0.2 s a setting."""
    saved = json.loads(run_config.to_json_best_effort())
    reference = state_arrays(run_config)
    tried, shaping = [], []
    for setting in SETTINGS:
        if setting.section not in ("model", "training") or setting.key in NOT_TRIED:
            continue
        config = run_config.copy_and_resolve_references()
        config[setting.section][setting.name] = other_value(setting.key, config[setting.section][setting.name])
        tried.append(setting.key)
        changes = state_arrays(config) != reference
        assert changes == bool(state_changes(saved, config)), (setting.key, changes)
        shaping += [setting.key] if changes else []
    assert {"training.grad_clip_norm", "model.d_model", "model.param_dtype", "model.scan_layers"} <= set(shaping)
    assert "training.learning_rate_scale" in tried and "model.dropout_rate" in tried
    # A learned position table has max_len rows: max_len shapes the state only then.
    run_config.model.positional_encoding = "learned"
    learned = run_config.copy_and_resolve_references()
    learned.model.max_len = 256
    saved = json.loads(run_config.to_json_best_effort())
    assert state_arrays(learned) != state_arrays(run_config)
    assert state_changes(saved, learned) == {"model.max_len": [128, 256]}
    # Clipping at another norm keeps the state: only turning it on or off changes it.
    clipped = run_config.copy_and_resolve_references()
    clipped.training.grad_clip_norm = 1.0
    saved = json.loads(clipped.to_json_best_effort())
    clipped.training.grad_clip_norm = 5.0
    assert state_changes(saved, clipped) == {}
    assert set(STATE_SETTINGS) <= set(shaping) | {"model.max_len"}


def workdir_with_checkpoint(tmp_path, config) -> str:
    (tmp_path / "checkpoints" / "6").mkdir(parents=True)
    (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=2))
    return str(tmp_path)


def test_a_resume_that_changes_the_state_is_one_line_naming_each_setting_and_the_flags_that_resume(run_config,
                                                                                                 tmp_path):
    workdir = workdir_with_checkpoint(tmp_path, run_config)
    config = run_config.copy_and_resolve_references()
    config.training.grad_clip_norm = 1.0
    with pytest.raises(ConfigError) as refused:
        check_state_settings(workdir, config)
    assert str(refused.value) == (
        f"training.grad_clip_norm 0.0 -> 1.0 would change the optimizer state that the checkpoints in {workdir} hold "
        "(turning clipping on or off adds or removes a step of the optimizer, with a state of its own), so the run "
        "cannot resume with it; pass --config.training.grad_clip_norm=0.0 to resume, or start a new run in another "
        "--workdir")
    config.training.grad_clip_norm = 0.0
    config.model.update(norm_position="pre", d_ff=128, dropout_rate=0.3)  # dropout shapes nothing: not named
    with pytest.raises(ConfigError, match=r'^model.d_ff 64 -> 128, model.norm_position "post" -> "pre" would change '
                                          r"the parameters .* cannot resume with them; pass --config.model.d_ff=64 "
                                          r"--config.model.norm_position=post to resume"):
        check_state_settings(workdir, config)
    config.model.update(norm_position="post", d_ff=64)
    check_state_settings(workdir, config)  # another dropout rate: a recorded change, not a refusal


def test_without_checkpoints_or_a_readable_config_json_nothing_is_refused(run_config, tmp_path):
    config = run_config.copy_and_resolve_references()
    config.training.grad_clip_norm = 1.0
    check_state_settings(str(tmp_path), config)  # a new workdir
    workdir = workdir_with_checkpoint(tmp_path, run_config)
    (tmp_path / "checkpoints" / "6").rmdir()
    check_state_settings(workdir, config)  # stopped before its first checkpoint: it starts afresh
    (tmp_path / "checkpoints" / "6").mkdir()
    (tmp_path / "config.json").write_text("{cut sho")
    check_state_settings(workdir, config)  # damaged: said where it is read; the restore checks the shapes
    saved = json.loads(run_config.to_json_best_effort())
    del saved["training"]["grad_clip_norm"]  # a config.json of a version before the setting
    (tmp_path / "config.json").write_text(json.dumps(saved))
    check_state_settings(workdir, config)
