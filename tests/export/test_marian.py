"""Hugging Face Marian (OPUS-MT) checkpoints in and out, against transformers itself on tiny random models."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import re
import subprocess
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from marian_models import tiny_marian
from runs import command, script_env
from safetensors.numpy import load_file
from transformers import MarianMTModel, MarianTokenizer

from transformer_jax.checkpoints.initial import adopt_initial_model
from transformer_jax.checkpoints.saved_run import open_run
from transformer_jax.checkpoints.selection import checkpoint_params
from transformer_jax.cli.import_marian import import_marian
from transformer_jax.decoding.beam_search import beam_search
from transformer_jax.decoding.sampling import greedy_decode
from transformer_jax.errors import ConfigError
from transformer_jax.export import export_run, export_target
from transformer_jax.export.hf_directory import read_marian
from transformer_jax.export.marian import export_rows, marian_to_ours, model_config_of
from transformer_jax.model.special_tokens import EOS_ID
from transformer_jax.model.transformer import Transformer
from transformer_jax.run import Trainer, assemble_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRA = 20  # output tokens beyond the source length (the tiny models have 64 positions)
SENTENCES = ["a small test sentence", "the dog is very old", "we see the big red house", "one two three"]
# (shared embeddings, activation, tied output): OPUS-MT's, separate tables with an untied projection, and a
# shared table with an untied projection (transformers v5 then saves the stacks' tables apart).
VARIANTS = [(True, "swish", True, False), (False, "relu", False, False), (True, "gelu", False, False),
            (False, "swish", True, True)]  # the last: separate source and target vocabularies


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """transformers' models on one thread: the tiny models' operations are too small to split, and torch's second
    thread spins while it waits (about ten times the CPU for the same outputs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ended_early(directory: str) -> str:
    """The tiny model with EOS favoured, so that searches end by choice, not at the length limit."""
    model = MarianMTModel.from_pretrained(directory)
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] += 2.0
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def opus(tmp_path_factory):
    """An OPUS-MT-like tiny model (shared, swish, tied), imported into a run directory."""
    hf_dir = ended_early(tiny_marian(tmp_path_factory.mktemp("opus") / "hf"))
    text = tmp_path_factory.mktemp("text")  # a test split to score on: the sentences, references made up
    for split in ("dev", "test"):
        (text / f"{split}.en").write_text("\n".join(SENTENCES) + "\n")
        (text / f"{split}.de").write_text("\n".join(reversed(SENTENCES)) + "\n")
    workdir = import_marian(str(hf_dir), str(tmp_path_factory.mktemp("imported") / "run"), text_data=str(text))
    return str(hf_dir), workdir


@pytest.fixture(scope="module")
def opus_params(opus):
    """The imported run's parameters (its one checkpoint, step 0), read once for the tests that only read them."""
    return checkpoint_params(open_run(opus[1]), [0])


def hf_source(tokenizer: MarianTokenizer, sentences: list[str]) -> dict[str, torch.Tensor]:
    return tokenizer(sentences, return_tensors="pt", padding=True)


def our_source(run, sentences: list[str]) -> np.ndarray:
    rows = [run.tokenizer.encode(text) + [EOS_ID] for text in sentences]
    src = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        src[i, :len(row)] = row
    return src


@pytest.mark.parametrize("shared, activation, tied, separate", VARIANTS)
def test_imported_logits_equal_transformers(tmp_path, shared, activation, tied, separate):
    hf_dir = tiny_marian(tmp_path, shared_embeddings=shared, activation=activation, tie_word_embeddings=tied,
                         separate_vocabs=separate)
    hf_config, tensors, vocabulary = read_marian(str(hf_dir))
    config = model_config_of(hf_config, tensors).replace(attention_backend="einsum")
    # transformers (v5) keeps one table for both stacks only when the output is tied to it as well
    assert (config.share_embeddings, config.activation, config.tie_output_embedding) == (shared and tied, activation, tied)
    params = marian_to_ours(tensors, config, vocabulary.marian_ids)
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    batch = hf_source(tokenizer, SENTENCES)
    pad = hf_config["pad_token_id"]
    ours_src = np.zeros(batch["input_ids"].shape, np.int32)
    for i, text in enumerate(SENTENCES):  # our vocabulary gives Marian's pieces, renumbered
        ids = vocabulary.encode(text) + [EOS_ID]
        assert [int(vocabulary.marian_ids[t]) for t in ids] == [t for t in batch["input_ids"][i].tolist() if t != pad]
        ours_src[i, :len(ids)] = ids
    target_ids = tokenizer(text_target=SENTENCES[1])["input_ids"]  # the target side: its own model and table
    assert [int(vocabulary.marian_ids[t]) for t in vocabulary.encode(SENTENCES[1], target=True) + [EOS_ID]] == target_ids
    marian_targets = np.array([[pad, 5, 9, 12, 7, 20]] * len(SENTENCES))
    ours_targets = np.array([[2, *(np.flatnonzero(vocabulary.marian_ids == t)[0] for t in row[1:])]
                             for row in marian_targets], np.int32)
    with torch.no_grad():
        theirs = MarianMTModel.from_pretrained(hf_dir).eval()(
            **batch, decoder_input_ids=torch.tensor(marian_targets)).logits.numpy()
    ours = np.asarray(Transformer(config).apply({"params": params}, jnp.asarray(ours_src), jnp.asarray(ours_targets)))
    np.testing.assert_allclose(ours, theirs[..., vocabulary.marian_ids], atol=1e-4, rtol=0)


def hf_generate(hf_dir: str, sentences: list[str], beams: int, extra: int = EXTRA, ids: bool = False) -> list[Any]:
    """transformers' search, as ours: length_penalty 0 (plain log-probabilities, as ours with alpha 0), at most the
    sentence's source tokens (EOS included) + `extra` new tokens, no forced EOS at that limit (one sentence at a
    time: its limit is per batch); pad never emitted (the model's generation config)."""
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    model = MarianMTModel.from_pretrained(hf_dir).eval()
    outputs = []
    for sentence in sentences:
        batch = hf_source(tokenizer, [sentence])
        with torch.no_grad():
            out = model.generate(**batch, num_beams=beams, length_penalty=0.0, do_sample=False, early_stopping=True,
                                 max_new_tokens=batch["input_ids"].shape[1] + extra, forced_eos_token_id=None)
        if ids:  # the tokens after the decoder start, up to EOS (0)
            tokens = out[0, 1:].tolist()
            outputs.append(tokens[:tokens.index(0)] if 0 in tokens else tokens)
        else:
            outputs += tokenizer.batch_decode(out, skip_special_tokens=True)
    return outputs


def test_greedy_and_beam_translations_equal_generate(opus, opus_params):
    hf_dir, workdir = opus
    run = open_run(workdir)
    params = opus_params
    config = run.model_config.replace(attention_backend="einsum")
    src = our_source(run, SENTENCES)
    greedy = np.asarray(greedy_decode(params, config, src, max_extra_length=EXTRA))
    generated = hf_generate(hf_dir, SENTENCES, beams=1)
    assert [run.tokenizer.decode(row) for row in greedy] == generated
    tokens, _ = beam_search(params, config, src, beam_size=4, alpha=0.0, max_extra_length=EXTRA)
    assert [run.tokenizer.decode(row) for row in np.asarray(tokens)[:, 0]] == hf_generate(hf_dir, SENTENCES, beams=4)
    assert len({len(text) for text in generated}) > 1  # outputs of several lengths


def eval_rows(rows: list[list[str]], directory, stdin: str) -> list[subprocess.CompletedProcess]:
    """Each of `rows` (eval.py's flags) as `python eval.py ROW` runs it, all in one process (tests/cli_rows.py: one
    start-up of Python and JAX, and one compile of a program the rows share), with `stdin` as its standard input."""
    rows_file, out = directory / "rows.json", directory / "results.json"
    rows_file.write_text(json.dumps(rows))
    done = subprocess.run(command("tests/cli_rows.py", "eval.py", rows_file, out), input=stdin, capture_output=True,
                          text=True, cwd=ROOT, env=script_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [subprocess.CompletedProcess(row, r["returncode"], r["stdout"], r["stderr"])
            for row, r in zip(rows, json.loads(out.read_text()))]


def test_eval_translates_a_file_stdin_and_on_a_mesh_as_transformers_does(opus, tmp_path):
    hf_dir, workdir = opus
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(SENTENCES) + "\n")
    flags = [f"--workdir={workdir}", "--mode=greedy", f"--max_extra_length={EXTRA}"]
    from_file, from_stdin, scored = eval_rows([[*flags, f"--translate={lines}"], [*flags, "--translate=-"],
                                               [*flags, "--split=test"]], tmp_path, stdin=SENTENCES[0] + "\n")
    assert from_file.returncode == 0, from_file.stderr[-2000:]
    generated = hf_generate(hf_dir, SENTENCES, beams=1)
    assert from_file.stdout.splitlines() == generated
    assert from_stdin.stdout.splitlines() == generated[:1], from_stdin.stderr[-2000:]  # hf_generate: each alone
    assert "SacreBLEU" in scored.stdout, scored.stderr[-2000:]
    hypotheses = [path for path in os.listdir(os.path.join(workdir, "eval")) if path.endswith(".hyp")]
    with open(os.path.join(workdir, "eval", hypotheses[0]), encoding="utf-8") as f:
        assert f.read().splitlines() == from_file.stdout.splitlines()
    on_a_mesh = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), *flags, f"--translate={lines}",
                                "--cpu_devices=2"], capture_output=True, text=True, cwd=ROOT)  # rows over two devices
    assert on_a_mesh.stdout == from_file.stdout, on_a_mesh.stderr[-2000:]


def test_import_then_export_gives_back_the_checkpoint(opus, opus_params, tmp_path):
    hf_dir, workdir = opus
    run = open_run(workdir)
    out = export_run(run, opus_params, export_target("hf", str(tmp_path / 'out')))
    original, exported = load_file(os.path.join(hf_dir, "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
    for name, value in original.items():
        if name.endswith("k_proj.bias"):  # the softmax cancels it: dropped on import, zeros on export
            assert not exported[name].any()
            continue
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    for name in ("vocab.json", "source.spm", "target.spm"):
        with open(os.path.join(hf_dir, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            if name == "vocab.json":
                assert json.load(a) == json.load(b)
            else:
                assert a.read() == b.read()
    assert hf_generate(out, SENTENCES, beams=4) == hf_generate(hf_dir, SENTENCES, beams=4)


def test_a_run_of_ours_exported_generates_our_translations(trained_run, tmp_path):
    run = open_run(str(trained_run["workdir"]))
    params = checkpoint_params(run, [run.checkpointer.latest_step()])
    # Six steps teach the tiny run little more than to end at once: its EOS row zeroed, it writes words.
    params["shared_embedding"]["embedding"][EOS_ID] = 0.0
    out = export_run(run, params, export_target("hf", str(tmp_path / 'hf')))
    sentences = ["the small house", "a dog sees the tree", "we have two red books"]
    config = run.model_config.replace(attention_backend="einsum")
    greedy = np.asarray(greedy_decode(params, config, our_source(run, sentences), max_extra_length=EXTRA))
    marian_id = np.argsort(export_rows(config.vocab_size))  # our id -> Marian's (PAD has none: never emitted)
    tokenizer = MarianTokenizer.from_pretrained(out)  # our SentencePiece model and pieces, as Marian's tokenizer
    for sentence, row in zip(sentences, our_source(run, sentences).tolist()):
        assert tokenizer(sentence)["input_ids"] == [int(marian_id[t - 1]) for t in row if t]
    ours = [[int(marian_id[t - 1]) for t in (row[:row.index(EOS_ID)] if EOS_ID in row else row) if t]
            for row in greedy.tolist()]
    assert ours == hf_generate(out, sentences, beams=1, ids=True)
    assert all(ours)  # words, not only EOS


@pytest.mark.parametrize("damage, message", [
    (lambda d: os.remove(d / "vocab.json"), "is not a Marian checkpoint: it lacks vocab.json"),
    (lambda d: _edit_config(d, scale_embedding=False), "scale_embedding=false"),
    (lambda d: _edit_config(d, encoder_layers=3), "different encoder and decoder depths"),
    (lambda d: _edit_config(d, model_type="bart"), "not a Marian one"),
    (lambda d: _edit_json(d / "vocab.json", lambda v: {**v, "extra_piece": len(v)}), "does not belong to these weights"),
])
def test_bad_marian_directories_are_refused_and_nothing_is_written(tmp_path, damage, message):
    hf_dir = tiny_marian(tmp_path / "hf")
    damage(tmp_path / "hf")
    with pytest.raises(ConfigError, match=re.escape(message)):
        import_marian(str(hf_dir), str(tmp_path / "run"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_the_import_command_says_what_is_wrong_in_one_line(tmp_path):
    hf_dir = tiny_marian(tmp_path / "hf")
    _edit_config(tmp_path / "hf", scale_embedding=False)
    result = subprocess.run([sys.executable, "-m", "transformer_jax.cli.import_marian", f"--hf_dir={hf_dir}",
                             f"--workdir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "scale_embedding=false" in result.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_an_export_target_that_exists_is_refused(opus, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        export_target("hf", str(tmp_path / 'out'))
    assert os.listdir(tmp_path / "out") == ["keep.txt"]


def test_fine_tuning_an_imported_model_then_resuming(opus, opus_params, tmp_path):
    hf_dir, imported = opus
    text = tmp_path / "text"
    text.mkdir()
    for split, count in (("train", 200), ("dev", 8), ("test", 8)):
        rows = [SENTENCES[i % len(SENTENCES)].split()[: 2 + i % 3] for i in range(count)]
        (text / f"{split}.en").write_text("\n".join(" ".join(row) for row in rows) + "\n")
        (text / f"{split}.de").write_text("\n".join(" ".join(reversed(row)) for row in rows) + "\n")
    config = finetune_config()  # configs/finetune_opus_mt.py, as docs/opus_mt.md runs it, shrunk to seconds
    config.data.update(path=str(text), tokens_per_batch=256, max_length=16)
    # No dev evaluation (~1.3 s of CPU compiling and running it): nothing here reads one; `score` on an imported run
    # (test_eval_translates_a_file_stdin_and_on_a_mesh_as_transformers_does) computes its dev-style loss.
    config.training.update(num_train_steps=3, warmup_steps=2, peak_learning_rate=1e-3, init_from=imported,
                           log_every=1, eval_every=0, bleu_every=0, checkpoint_every=3)
    workdir = str(tmp_path / "tuned")
    config = adopt_initial_model(config, workdir)
    assert config.model.activation == "swish" and config.model.output_bias
    trainer = Trainer(assemble_run(config, workdir))
    start = nn.meta.unbox(trainer.state.params)
    trainer.run()
    trainer.close()
    run = open_run(workdir)
    assert run.tokenizer.fingerprint == open_run(imported).tokenizer.fingerprint
    tuned, before = checkpoint_params(run, [3]), opus_params
    moved = [float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(tuned), jax.tree.leaves(before))]
    assert 0 < min(moved) and max(moved) < 0.1  # every weight trained a little, from the imported ones
    assert any(float(np.abs(a - b).max()) > 0.1 for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(start)))
    config.training.num_train_steps = 5
    resumed = Trainer(assemble_run(config, workdir))
    resumed.run()
    resumed.close()
    assert resumed.start_step == 3  # run() restored its own checkpoint, not the imported parameters (step 0)
    assert open_run(workdir).checkpointer.latest_step() == 5


def finetune_config():
    spec = importlib.util.spec_from_file_location("finetune_opus_mt", os.path.join(ROOT, "configs", "finetune_opus_mt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _edit_json(path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _edit_config(directory, **changes) -> None:
    _edit_json(directory / "config.json", lambda config: {**config, **changes})


def test_separate_vocabularies_import_and_export_exactly(tmp_path):
    hf_dir = ended_early(tiny_marian(tmp_path / "hf", shared_embeddings=False, separate_vocabs=True))
    workdir = import_marian(hf_dir, str(tmp_path / "run"))
    run = open_run(workdir)
    out = export_run(run, checkpoint_params(run, [0]), export_target("hf", str(tmp_path / 'out')))
    for name in ("vocab.json", "target_vocab.json"):
        with open(os.path.join(hf_dir, name)) as a, open(os.path.join(out, name)) as b:
            assert json.load(a) == json.load(b)
    config = run.model_config.replace(attention_backend="einsum")
    greedy = np.asarray(greedy_decode(checkpoint_params(run, [0]), config, our_source(run, SENTENCES),
                                      max_extra_length=EXTRA))
    assert [run.tokenizer.decode(row) for row in greedy] == hf_generate(hf_dir, SENTENCES, beams=1) \
        == hf_generate(out, SENTENCES, beams=1)


def test_a_model_id_is_read_from_the_local_hugging_face_cache_and_never_downloaded(tmp_path):
    """--hf_dir=ORG/NAME takes the snapshot `hf download` left in the cache (laid out here offline, as
    huggingface_hub keeps it); an id that is not cached is one line saying how to fetch it. (Both as
    `transformer-jax import` command lines, run in one process by tests/cli_rows.py: one start-up of Python and JAX.)"""
    hf_dir = tiny_marian(tmp_path / "hf")
    cache = tmp_path / "hub"
    snapshot = cache / "models--Helsinki-NLP--opus-mt-tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(hf_dir, snapshot)
    (cache / "models--Helsinki-NLP--opus-mt-tiny" / "refs").mkdir()
    (cache / "models--Helsinki-NLP--opus-mt-tiny" / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    rows = [["import", "--hf_dir=Helsinki-NLP/opus-mt-tiny", f"--workdir={tmp_path / 'run'}"],
            ["import", "--hf_dir=Helsinki-NLP/opus-mt-xx-yy", f"--workdir={tmp_path / 'other'}"]]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    ran = subprocess.run(command("tests/cli_rows.py", "transformer-jax", tmp_path / "rows.json", tmp_path / "out.json"),
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    done, missing = json.loads((tmp_path / "out.json").read_text())
    assert done["returncode"] == 0, done["stderr"][-2000:]
    assert open_run(str(tmp_path / "run")).checkpointer.latest_step() == 0
    assert missing["returncode"] == 2 and "Traceback" not in missing["stderr"], missing["stderr"][-2000:]
    line = missing["stderr"].strip().splitlines()[-1]
    assert "holds no snapshot of that model id" in line and "hf download Helsinki-NLP/opus-mt-xx-yy" in line
    assert not (tmp_path / "other").exists()
