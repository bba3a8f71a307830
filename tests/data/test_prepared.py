"""The prepared corpus: token shards and a length index, read by row; damage and mismatches named, nothing overwritten."""

import json
import os
import pathlib

import numpy as np
import pytest

from transformer_jax.base import workdir as layout
from transformer_jax.config.schema import default_config
from transformer_jax.data import pipeline
from transformer_jax.data.batching import BatchIterator
from transformer_jax.data.encoded import encode_pairs, filter_by_length
from transformer_jax.data.corpus_writer import write_prepared
from transformer_jax.data.prepared import INDEX, MANIFEST, PreparedCorpus
from transformer_jax.data.sources import drop_empty_pairs
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import DataError


def small_config(**data):
    config = default_config()
    config.data.update({"source": "builtin", "builtin_train_size": 900, "builtin_dev_size": 12, "builtin_test_size": 12,
                        "vocab_size": 400, "tokenizer_sample_size": 1000, "tokens_per_batch": 512, "max_length": 64,
                        **data})
    return config


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The small built-in corpus prepared in 4 shards (by 2 worker processes), its training text and tokenizer."""
    directory = tmp_path_factory.mktemp("prepared")
    config = small_config()
    one = pipeline.prepare_corpus(config, str(directory / "one"))
    pairs, _ = drop_empty_pairs(pipeline.load_run_splits(config.data, 0, ("train",))["train"])
    splits = {name: one.split(name) for name in ("dev", "test")}
    four = write_prepared(str(directory / "four"), one.manifest["key"], str(directory / "one" / "tokenizer.model"),
                          list(pairs), splits, workers=2, shard_pairs=250)
    return config, one, four, pairs, Tokenizer.load(str(directory / "one" / "tokenizer.model"))


def test_reading_pairs_gives_their_encoding_whatever_the_shards_or_workers(prepared):
    _, one, four, pairs, tokenizer = prepared
    assert len(four.manifest["shards"]) == 4 and four.manifest["dtype"] == "uint16"
    expected = encode_pairs(pairs, tokenizer)
    items = np.random.default_rng(0).permutation(len(pairs))[:200]  # across all shards, out of order
    for corpus in (one, four):
        assert np.array_equal(corpus.source.lengths, expected.source.lengths)
        got = corpus.read(items)
        for side in ("source", "target"):
            assert [getattr(got, side)[i].tolist() for i in range(len(items))] == [
                getattr(expected, side)[int(item)].tolist() for item in items]
    # A selection (e.g. the length filter) reads through to the same pairs.
    assert four.select(items[:5]).read(np.array([4, 0])).source[0].tolist() == expected.source[int(items[4])].tolist()


def test_a_process_reads_only_the_pairs_of_its_rows_and_the_processes_together_read_one_process_batches(prepared):
    _, one, _, _, _ = prepared
    corpus, _ = filter_by_length(PreparedCorpus.open(one.directory), 64)
    alone = BatchIterator(corpus, 512, 64, row_multiple=4, seed=3)
    batches = [next(alone) for _ in range(3)]
    total = corpus.records_read
    shards, counts = [], []
    for process in range(4):
        mine, _ = filter_by_length(PreparedCorpus.open(one.directory), 64)
        iterator = BatchIterator(mine, 512, 64, row_multiple=4, seed=3, process_index=process, process_count=4)
        shards.append([next(iterator) for _ in range(3)])
        counts.append(mine.records_read)
        in_rows = sum(int(batch["inputs_segmentation"].max(axis=1).sum()) for batch in shards[-1])
        assert mine.records_read == in_rows  # its own pairs, no more
    assert sum(counts) == total and max(counts) < total
    for index, batch in enumerate(batches):
        for key in batch:
            assert np.array_equal(np.concatenate([shard[index][key] for shard in shards]), batch[key])


def copy_corpus(source: PreparedCorpus, directory: pathlib.Path) -> pathlib.Path:
    directory.mkdir()
    for name in os.listdir(source.directory):
        (directory / name).write_bytes((pathlib.Path(source.directory) / name).read_bytes())
    return directory


def damage_index(directory):
    path = directory / INDEX
    with np.load(path) as index:
        source, target = index["source_lengths"].copy(), index["target_lengths"]
    source[0] += 1  # the index edited after preparing
    np.savez(path, source_lengths=source, target_lengths=target)


def flip_tokens(directory, manifest):
    path = directory / manifest["shards"][0]["name"]
    data = bytearray(path.read_bytes())
    data = data[2:] + data[:2]  # same size, ids one place off: EOS no longer where the index puts it
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda d, m: damage_index(d), "lengths.npz changed since the corpus was prepared"),
    (lambda d, m: (d / m["shards"][1]["name"]).unlink(), "train-00001-of-00004.tokens is missing"),
    (lambda d, m: (d / m["shards"][2]["name"]).write_bytes((d / m["shards"][2]["name"]).read_bytes()[:-6]),
     "train-00002-of-00004.tokens has"),
    (lambda d, m: (d / MANIFEST).write_text("{not json"), "manifest.json is damaged"),
    (lambda d, m: (d / MANIFEST).unlink(), "is not a prepared corpus"),
])
def test_a_damaged_corpus_is_named_with_its_fix_and_left_as_it_is(prepared, tmp_path, damage, message):
    directory = copy_corpus(prepared[2], tmp_path / "corpus")
    damage(directory, prepared[2].manifest)
    before = {path.name: path.read_bytes() for path in directory.iterdir()}
    with pytest.raises(DataError, match=message) as error:
        PreparedCorpus.open(str(directory))
    assert "prepare" in str(error.value) and "\n" not in str(error.value)
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before


def test_tokens_that_do_not_match_the_index_are_named_when_read(prepared, tmp_path):
    directory = copy_corpus(prepared[2], tmp_path / "corpus")
    flip_tokens(directory, prepared[2].manifest)
    corpus = PreparedCorpus.open(str(directory))  # same sizes: only reading can tell
    with pytest.raises(DataError, match="train-00000-of-00004.tokens holds tokens that do not match its index"):
        corpus.read(np.arange(3))


def test_a_run_refuses_a_corpus_from_another_tokenizer_or_other_settings(prepared, tmp_path):
    config, one, _, _, _ = prepared
    workdir = tmp_path / "run"
    workdir.mkdir()
    other_tokenizer = pipeline.prepare_corpus(small_config(vocab_size=450), str(tmp_path / "other"))
    (workdir / layout.TOKENIZER).write_bytes((pathlib.Path(other_tokenizer.directory) / "tokenizer.model").read_bytes())
    config.data.prepared = one.directory
    with pytest.raises(DataError, match="was prepared with another tokenizer than .*tokenizer.model"):
        pipeline.run_corpus(config, str(workdir))
    # Settings that make other pairs: refused, naming the setting and the value it was prepared with.
    fresh = tmp_path / "fresh"
    changed = small_config(builtin_test_size=30, prepared=one.directory)
    with pytest.raises(DataError, match="data.builtin_test_size=30 differs from the 12 .* prepare the corpus again"):
        pipeline.run_corpus(changed, str(fresh))
    assert not (fresh / layout.TOKENIZER).exists()


def test_a_run_on_a_prepared_corpus_tokenizes_no_training_text(prepared, tmp_path, monkeypatch):
    config, one, _, _, _ = prepared
    config.data.prepared = one.directory
    monkeypatch.setattr(pipeline, "load_run_splits", lambda *a, **k: pytest.fail("the source was read"))
    encoded = []
    real = pipeline.encode_pairs
    monkeypatch.setattr(pipeline, "encode_pairs", lambda pairs, tok, **kw: encoded.append(len(pairs)) or real(pairs, tok, **kw))
    data = pipeline.prepare_data(config, str(tmp_path / "run"))
    next(data.train)
    assert encoded == [12, 12]  # dev and test only
    assert (tmp_path / "run" / layout.TOKENIZER).read_bytes() == (pathlib.Path(one.directory) / "tokenizer.model").read_bytes()
    assert pipeline.run_split(config, str(tmp_path / "run"), "test") == one.split("test")


def test_preparing_into_a_directory_with_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="holds other files \\(notes.txt\\)"):
        pipeline.prepare_corpus(small_config(), str(tmp_path))
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_a_corpus_prepared_in_a_bucket_reads_like_a_local_one(prepared, gcs_workdir):
    config, one, _, pairs, _ = prepared
    remote = pipeline.prepare_corpus(config, f"{gcs_workdir}/corpus")
    again = PreparedCorpus.open(f"{gcs_workdir}/corpus")
    assert json.dumps(again.manifest["shards"]) == json.dumps(one.manifest["shards"])
    items = np.array([5, len(one) - 1, 3])
    local, got = one.read(items), again.read(items)
    assert np.array_equal(got.source.values, local.source.values) and np.array_equal(got.target.values, local.target.values)
    assert remote.split("dev") == one.split("dev")


@pytest.mark.parametrize("source", ["text", "tsv", "tfds"])
def test_text_tsv_and_tfds_prepare_the_same_way_and_read_back_their_training_pairs(source, tmp_path):
    """Every source is prepared by the same code: the shards read back the encoding of its training pairs."""
    tfds = pytest.importorskip("tensorflow_datasets")
    pairs = [(f"the house number {i} is small", f"das Haus Nummer {i} ist klein") for i in range(60)]
    if source == "text":
        for split in ("train", "dev", "test"):
            (tmp_path / f"{split}.en").write_text("\n".join(p[0] for p in pairs) + "\n")
            (tmp_path / f"{split}.de").write_text("\n".join(p[1] for p in pairs) + "\n")
    elif source == "tsv":
        for split in ("train", "dev", "test"):
            (tmp_path / f"{split}.tsv").write_text("\n".join("\t".join(p) for p in pairs) + "\n")
    config = small_config(source=source, path="" if source == "tfds" else str(tmp_path), vocab_size=120 if source == "tfds" else 40, byte_fallback=False,
                          tokenizer_sample_size=200)
    with tfds.testing.mock_data(num_examples=40):
        expected = pipeline.load_run_splits(config.data, 0, ("train", "test"))
        corpus = pipeline.prepare_corpus(config, str(tmp_path / "prepared"))
    train, _ = drop_empty_pairs(expected["train"])
    tokenizer = Tokenizer.load(str(tmp_path / "prepared" / "tokenizer.model"))
    encoded, got = encode_pairs(train, tokenizer), corpus.read_all()
    assert len(corpus) == len(train) > 0 and corpus.split("test") == expected["test"]
    for side in ("source", "target"):
        assert [getattr(got, side)[i].tolist() for i in range(len(train))] == [
            getattr(encoded, side)[i].tolist() for i in range(len(train))]


def test_prepare_cli_given_a_file_or_a_path_under_one_refuses_with_one_line(tmp_path):
    import subprocess
    import sys

    from runs import ROOT, assert_one_line_error, script_env, snapshot

    (tmp_path / "a_file").write_text("not a directory")
    before = snapshot(tmp_path)
    for output, fragments in [("a_file", ["a_file is a file, not the directory a prepared corpus is",
                                          "move it away or choose another --output"]),
                              ("a_file/corpus", ["a_file is a file, so the prepared corpus cannot be made at",
                                                 "choose another --output that is not under a file"])]:
        result = subprocess.run([sys.executable, "-m", "transformer_jax.cli.prepare", "--config=configs/smoke.py",
                                 f"--output={tmp_path / output}"], cwd=ROOT, env=script_env(), capture_output=True,
                                text=True, timeout=300)
        assert_one_line_error(result, *fragments)
    assert snapshot(tmp_path) == before


def test_preparing_after_an_interrupted_preparation_of_another_vocabulary_trains_its_own_tokenizer(prepared, tmp_path):
    config, one, _, _, _ = prepared
    leftover = pipeline.prepare_corpus(small_config(vocab_size=450), str(tmp_path / "other"))
    directory = tmp_path / "corpus"
    directory.mkdir()  # what a stopped preparation leaves: its tokenizer, no manifest
    (directory / layout.TOKENIZER).write_bytes((pathlib.Path(leftover.directory) / layout.TOKENIZER).read_bytes())
    corpus = pipeline.prepare_corpus(config, str(directory))
    assert Tokenizer.load(str(directory / layout.TOKENIZER)).vocab_size == corpus.manifest["vocab_size"] == 400
    assert (directory / layout.TOKENIZER).read_bytes() == (pathlib.Path(one.directory) / layout.TOKENIZER).read_bytes()
    values = corpus.read(np.arange(corpus.manifest["pairs"])).source.values
    assert values.max() < 400


def test_a_manifest_whose_vocabulary_was_edited_is_refused_and_ids_past_it_never_read(prepared, tmp_path):
    config, one, _, _, _ = prepared
    directory = copy_corpus(one, tmp_path / "corpus")
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["vocab_size"] = 300
    (directory / MANIFEST).write_text(json.dumps(manifest))
    config.data.prepared = str(directory)
    with pytest.raises(DataError, match="says vocab_size 300, but its tokenizer has 400 pieces") as error:
        pipeline.run_corpus(config, str(tmp_path / "run"))
    assert "prepare it again" in str(error.value) and "\n" not in str(error.value)
    corpus = PreparedCorpus.open(str(directory))
    with pytest.raises(DataError, match=r"train-00000-of-00001.tokens holds token id 3\d\d, outside the 300 pieces"):
        corpus.read(np.arange(corpus.manifest["pairs"]))
