"""The text API (`Translator`) and standard input read in blocks: batched, in the caller's order, as the file path;
a str is one sentence, every setting is used or refused, a checkpoint is named as --checkpoint names it."""

import io
import select
import subprocess
import sys

import pytest

import transformer_jax.evaluation.text_translation as text_translation
from runs import ROOT, script_env
from transformer_jax.checkpoints import checkpoint_params, open_run
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.decoding import DecodeOptions
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.evaluation import Translator, translate_file

WORDS = "the a dog cat house tree sleeps runs sees big small red".split()


def sentences(count: int) -> list[str]:
    return ["" if i % 9 == 4 else " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 13))
            for i in range(count)]


@pytest.fixture(scope="module")
def translator(trained_run):
    with Translator(str(trained_run["workdir"])) as loaded:
        yield loaded


def test_translations_come_back_in_the_callers_order_however_they_are_batched(translator):
    texts = sentences(40)
    sampled = translator.translate(texts, mode="sample", seed=1, top_k=5)
    assert len(sampled) == 40 and all(out == "" for text, out in zip(texts, sampled) if not text)
    assert len(set(sampled)) > 20
    # Batched by tokens or by sentences, alone or together: each sentence gets the same translation.
    by_tokens = translator.translate(texts, mode="beam", batch_tokens=64)
    assert by_tokens == translator.translate(texts, mode="beam", batch_size=7)
    assert by_tokens[1:5] == [translator.translate([text], mode="beam")[0] for text in texts[1:5]]  # 2-4 words, ""
    assert translator.translate([]) == []


def test_a_string_is_one_sentence_and_gives_one_string(translator):
    text = "the dog sleeps ."
    (from_list,) = translator.translate([text], mode="greedy", max_extra_length=4)
    one = translator.translate(text, mode="greedy", max_extra_length=4)
    assert isinstance(one, str) and one == from_list  # not one translation per character
    assert translator.translate((text, text), mode="greedy", max_extra_length=4) == [from_list] * 2
    with pytest.raises(ConfigError, match=r"texts\[1\] is of type int, not str; pass text"):
        translator.translate([text, 3])


@pytest.mark.parametrize("settings, refused", [
    ({"top_k": 5}, "top_k applies to mode='sample', not mode='beam'; drop it, or pass mode='sample'"),
    ({"mode": "greedy", "beam_size": 8}, "beam_size applies to mode='beam', not mode='greedy'; drop it"),
    ({"max_extra_length": 2147483648}, "max_extra_length=2147483648 must be a positive integer, at most 2**30"),
    ({"mode": "sample", "top_k": 2**31}, "top_k=2147483648 must be 0 (keep every token) or a positive integer"),
])
def test_a_setting_that_would_be_ignored_or_overflow_is_one_line_before_any_work(translator, settings, refused):
    """As the command line refuses --top_k without --mode=sample: a setting is used, or refused; never dropped."""
    with pytest.raises(ConfigError) as error:
        translator.translate(["the dog"], **settings)
    assert str(error.value).startswith(refused) and "\n" not in str(error.value)


def test_a_checkpoint_is_named_by_its_step_as_an_int_or_as_the_flag_writes_it(trained_run, translator):
    latest = translator.steps[-1]
    for spec in (latest, str(latest)):
        with Translator(str(trained_run["workdir"]), checkpoint=spec) as chosen:
            assert chosen.steps == [latest]
    with pytest.raises(CheckpointError, match=r"--checkpoint=999 is not latest, best, average:N or a saved step; "
                                              r"available steps: "):
        Translator(str(trained_run["workdir"]), checkpoint=999)
    with pytest.raises(CheckpointError, match=r"checkpoint=4\.5 is not latest, best, average:N, average or a step"):
        Translator(str(trained_run["workdir"]), checkpoint=4.5)


def test_a_sentence_longer_than_the_model_is_cut_and_counted(translator):
    before = translator.truncated
    (out,) = translator.translate([" ".join(WORDS * 40)], mode="greedy")
    assert translator.truncated == before + 1 and isinstance(out, str)


def test_standard_input_is_decoded_in_blocks_with_the_files_translations(trained_run, tmp_path, monkeypatch):
    lines = sentences(200)
    path = tmp_path / "in.txt"
    path.write_text("".join(line + "\n" for line in lines))
    run = open_run(str(trained_run["workdir"]))
    params = checkpoint_params(run, [run.checkpointer.latest_step()])
    options = DecodeOptions(mode="greedy", max_extra_length=4)
    chunks = []
    original = text_translation._translate_chunk
    monkeypatch.setattr(text_translation, "_translate_chunk",
                        lambda run, params, texts, *args: chunks.append(len(texts)) or original(run, params, texts,
                                                                                                 *args))
    batching = TranslationBatching(batch_size=50, batch_tokens=256)
    from_file = list(translate_file(run, params, str(path), options, batching=batching))
    file_chunks, chunks[:] = list(chunks), []
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    from_stdin = list(translate_file(run, params, "-", options, batching=batching))
    run.checkpointer.close()
    assert from_stdin == from_file and len(from_stdin) == 200
    assert chunks == file_chunks == [50] * 4  # blocks of 50 lines (each in token-budget batches), not line by line


def test_a_line_samples_the_same_in_any_block_or_batch(trained_run, tmp_path):
    """Each line draws from the seed folded with its line number: blocks of 50 or of 11 lines, in batches of
    their own, give the same samples; another seed gives others."""
    path = tmp_path / "in.txt"
    path.write_text("".join(line + "\n" for line in sentences(60)))
    run = open_run(str(trained_run["workdir"]))
    params = checkpoint_params(run, [run.checkpointer.latest_step()])
    try:
        def sampled(seed, batching):
            options = DecodeOptions(mode="sample", temperature=2.0, seed=seed, max_extra_length=4)
            return list(translate_file(run, params, str(path), options, batching=batching))

        fifty = sampled(4, TranslationBatching(batch_size=50, batch_tokens=256))
        eleven = sampled(4, TranslationBatching(batch_size=11))
        other_seed = sampled(5, TranslationBatching(batch_size=50, batch_tokens=256))
    finally:
        run.checkpointer.close()
    assert fifty == eleven and len(fifty) == 60
    assert sum(a != b for a, b in zip(fifty, other_seed)) > 30


def test_a_line_typed_alone_is_answered_before_the_input_ends(trained_run):
    """An interactive user: one line, standard input left open, and its translation arrives."""
    translate = subprocess.Popen([sys.executable, "-m", "transformer_jax", "translate",
                                  f"--workdir={trained_run['workdir']}", "--mode=sample"], cwd=ROOT, env=script_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in ("the dog sleeps", "the red house"):
            translate.stdin.write(line + "\n")
            translate.stdin.flush()
            ready, _, _ = select.select([translate.stdout], [], [], 120)  # start-up and compiling included
            assert ready, "no translation while standard input stays open"
            assert translate.stdout.readline().endswith("\n")
        translate.stdin.close()
        assert translate.wait(timeout=60) == 0, translate.stderr.read()[-2000:]
    finally:
        if translate.poll() is None:
            translate.kill()
            translate.wait()
