"""The configuration reference: every key documented, and the table of docs/configuration.md equal to the generated one."""

import dataclasses
import pathlib

from transformer_jax.model.config import TransformerConfig
from transformer_jax.config import reference as config_reference
from transformer_jax.config.schema import default_config

README = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def flat_keys() -> set[str]:
    return {f"{section}.{key}" for section, values in default_config().items() for key in values}


def test_every_key_of_the_run_config_has_a_row_with_its_default():
    rows = {key: (default, meaning) for key, default, _, meaning in config_reference.reference_rows()}
    assert set(rows) == flat_keys()
    config = default_config()
    for key, (default, _) in rows.items():
        section, name = key.split(".")
        assert default == config[section][name], key


def test_every_key_has_a_meaning_and_the_model_keys_come_from_transformer_config():
    rows = {key: meaning for key, _, _, meaning in config_reference.reference_rows()}
    assert all(meaning.strip() for meaning in rows.values())
    for field in dataclasses.fields(TransformerConfig):
        assert rows[f"model.{field.name}"].startswith(field.metadata["help"]), field.name
    # The run's own default for the vocabulary follows the model's meaning.
    assert rows["model.vocab_size"] == ("size of the joint source/target vocabulary (token id 0 is padding). "
                                        "0 takes the tokenizer's size; any other value must equal it.")


def test_the_reference_parses_no_source():
    """The declaration is data: the reference neither tokenizes nor parses code or docstrings."""
    source = pathlib.Path(config_reference.__file__).read_text(encoding="utf-8")
    for module in ("tokenize", "ast", "inspect"):
        assert f"import {module}" not in source


def test_the_allowed_column_shows_each_declared_bound_and_choice():
    rows = {key: allowed for key, _, allowed, _ in config_reference.reference_rows()}
    assert (rows["data.tokens_per_batch"], rows["data.row_width"], rows["training.label_smoothing"]) == (
        "> 0", ">= 0", "[0, 1)")
    assert rows["training.loss_kernel"] == "auto, pallas, xla" and rows["model.remat"] == "none, full, dots"
    assert rows["mesh.data"] == "-1, or > 0" and rows["data.source_lang"] == ""
    assert (rows["data.source"], rows["model.dtype"], rows["eval.dtype"]) == (
        "builtin, tfds, text, tsv", "float32, bfloat16", '"", float32, bfloat16')
    assert (rows["eval.max_extra_length"], rows["model.dropout_rate"], rows["model.num_layers"]) == (
        "[1, 2**30]", "[0, 1)", "> 0")


def test_the_allowed_column_is_the_declaration_and_no_limited_setting_has_an_empty_cell():
    from transformer_jax.config.settings import SETTINGS

    rows = {key: allowed for key, _, allowed, _ in config_reference.reference_rows()}
    for setting in SETTINGS:
        declared = setting.bound.short if setting.bound is not None else ", ".join(
            '""' if choice == "" else choice for choice in setting.choices)
        assert rows[setting.key] == declared, setting.key
        assert bool(rows[setting.key]) == (setting.bound is not None or bool(setting.choices)), setting.key


def test_markdown_escapes_what_would_break_the_table():
    table = config_reference.markdown_table()
    row = next(line for line in table.splitlines() if line.startswith("| `data.eval_batch_size` "))
    assert row == r"| `data.eval_batch_size` | `64` | [1, 2\*\*30] | sentences per dev/test batch (rows, padded). |"
    assert config_reference._escape_markdown('"a" | "b"') == r'"a" \| "b"'
    assert "&lt;unk&gt;" in table and "<unk>" not in table
    assert all(line.count("|") - line.count(r"\|") == 5 for line in table.splitlines())


def test_readme_reference_is_up_to_date():
    section = config_reference.readme_section(README.read_text(encoding="utf-8"))
    assert section is not None, f"docs/configuration.md lacks the {config_reference.START_MARKER} section"
    assert section == config_reference.markdown_table(), (
        f"docs/configuration.md is out of date; run `{config_reference.UPDATE_COMMAND}`"
    )


def test_update_rewrites_a_stale_section(tmp_path):
    stale = tmp_path / "README.md"
    stale.write_text(f"# x\n\n{config_reference.START_MARKER}\n| old |\n{config_reference.END_MARKER}\nafter\n")
    config_reference.main(["--update", str(stale)])
    text = stale.read_text()
    assert config_reference.readme_section(text) == config_reference.markdown_table()
    assert text.startswith("# x\n\n") and text.endswith(f"{config_reference.END_MARKER}\nafter\n")


def test_non_finite_settings_are_config_errors():
    import math

    import pytest

    from transformer_jax.config.schema import check_run_config
    from transformer_jax.errors import ConfigError

    for section, key in (("training", "learning_rate_scale"), ("training", "adam_eps"),
                         ("model", "layer_norm_epsilon"), ("training", "label_smoothing")):
        for value in (math.inf, math.nan):
            config = default_config()
            config[section][key] = value
            with pytest.raises(ConfigError, match=f"{section}.{key}={value!r} must be a finite number"):
                check_run_config(config)


def test_an_unknown_loss_kernel_is_a_config_error():
    import pytest

    from transformer_jax.config.schema import check_run_config
    from transformer_jax.errors import ConfigError

    config = default_config()
    config.training.loss_kernel = "triton"
    with pytest.raises(ConfigError, match=r"training.loss_kernel='triton' is not one of \['auto', 'pallas', 'xla'\]"):
        check_run_config(config)
    config.training.loss_kernel = "pallas"
    check_run_config(config)
    assert config.training.loss_kernel == "pallas"


def test_config_help_lists_every_key_with_its_default_one_command_away():
    """`train.py --config_help` (and the preflight's, prepare's): the reference docs/configuration.md holds, as text."""
    import subprocess
    import sys

    from runs import ROOT, script_env
    from transformer_jax.config.reference import reference_rows

    for command in (["train.py"], ["-m", "transformer_jax.aot"]):
        done = subprocess.run([sys.executable, *command, "--config_help"], cwd=ROOT, env=script_env(),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
        lines = done.stdout.splitlines()
        for key, value, _, _ in reference_rows():
            assert f"--config.{key}={value!r}" in lines, key
        assert "    N, the number of layers in each of the encoder and decoder stacks. Allowed: > 0." in lines
        assert "    built-in corpus: training pairs. Allowed: > 0." in lines
