"""Data sources: text files and their bad inputs, TSV, TFDS (mocked), the built-in corpus."""

import os

import pytest

from transformer_jax.data import sources as data
from transformer_jax.errors import DataError


def _write(directory, name, content):
    path = directory / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return str(path)


@pytest.fixture
def text_dir(tmp_path):
    for split in data.SPLITS:
        _write(tmp_path, f"{split}.en", "Hello .\nGood morning .\n")
        _write(tmp_path, f"{split}.de", "Hallo .\nGuten Morgen .\n")
    return tmp_path


def test_text_files_give_source_target_pairs_in_the_configured_direction(text_dir):
    splits = data.load_splits("text", path=str(text_dir))
    assert set(splits) == {"train", "dev", "test"}
    assert splits["test"] == [("Hello .", "Hallo ."), ("Good morning .", "Guten Morgen .")]
    reverse = data.load_splits("text", path=str(text_dir), source_lang="de", target_lang="en")
    assert reverse["train"][1] == ("Guten Morgen .", "Good morning .")


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    source = _write(tmp_path, "train.en", "a\nb\nc\n")
    target = _write(tmp_path, "train.de", "x\ny\n")
    with pytest.raises(DataError) as error:
        data.read_parallel_text(source, target)
    message = str(error.value)
    assert "train.en has 3 lines" in message and "train.de has 2" in message and "\n" not in message


def test_fairseqs_valid_files_are_the_dev_split(text_dir):
    """valid.<lang> (fairseq's name) serves as dev when there is no dev.<lang>; dev wins when both are there."""
    for lang, line in (("en", "Valid ."), ("de", "Gültig .")):
        (text_dir / f"dev.{lang}").rename(text_dir / f"valid.{lang}")
        (text_dir / f"valid.{lang}").write_text(line + "\n")
    assert data.load_splits("text", path=str(text_dir))["dev"] == [("Valid .", "Gültig .")]
    reverse = data.load_splits("text", path=str(text_dir), source_lang="de", target_lang="en")
    assert reverse["dev"] == [("Gültig .", "Valid .")]
    _write(text_dir, "dev.en", "Dev .\n")
    _write(text_dir, "dev.de", "Entwicklung .\n")
    assert data.load_splits("text", path=str(text_dir))["dev"] == [("Dev .", "Entwicklung .")]


def test_missing_file_is_named(text_dir):
    (text_dir / "dev.de").unlink()
    with pytest.raises(DataError, match=r"dev\.de does not exist"):
        data.load_splits("text", path=str(text_dir))


def test_a_directory_a_pipe_or_a_dangling_link_in_place_of_a_file_says_what_it_is(text_dir):
    (text_dir / "train.en").unlink()
    (text_dir / "train.en").mkdir()
    with pytest.raises(DataError, match=r"train\.en is a directory, not a text file"):
        data.load_splits("text", path=str(text_dir))
    (text_dir / "train.en").rmdir()
    os.mkfifo(text_dir / "train.en")  # opening it would wait for a writer forever
    with pytest.raises(DataError, match=r"train\.en is not a regular file \(a named pipe"):
        data.load_splits("text", path=str(text_dir))
    (text_dir / "train.en").unlink()
    (text_dir / "train.en").symlink_to(text_dir / "gone.en")
    with pytest.raises(DataError, match=r"train\.en is a symbolic link to .*gone\.en, which does not exist"):
        data.load_splits("text", path=str(text_dir))


def test_a_leading_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path):
    source = _write(tmp_path, "test.en", "\ufeffThe dog .\nA cat .\n".encode())
    target = _write(tmp_path, "test.de", b"\xef\xbb\xbfDer Hund .\nEine Katze \xff.\n")
    with pytest.raises(DataError, match=r"test\.de line 2 is not valid UTF-8 \(byte 0xff\)"):
        data.read_parallel_text(source, target)  # line and byte counted as in the file
    target = _write(tmp_path, "test.de", "\ufeffDer Hund .\nEine Katze .\n".encode())
    assert data.read_parallel_text(source, target) == [("The dog .", "Der Hund ."), ("A cat .", "Eine Katze .")]
    assert data.read_tsv(_write(tmp_path, "a.tsv", "\ufeffone\teins\n".encode())) == [("one", "eins")]


def test_tsv_keeps_empty_fields_and_refuses_lines_whose_columns_shift(tmp_path):
    assert data.read_tsv(_write(tmp_path, "a.tsv", "\tleer\r\none\teins\r\n")) == [("", "leer"), ("one", "eins")]
    with pytest.raises(DataError, match=r"a\.tsv line 2 has 3 tab-separated fields but the first pair has 2; a tab inside"):
        data.read_tsv(_write(tmp_path, "a.tsv", "one\teins\ntwo\tzwei\textra\n"))


def test_tsv_columns_come_from_a_header_naming_the_languages_or_the_setting(tmp_path):
    reversed_columns = _write(tmp_path, "b.tsv", "de\ten\neins\tone\nzwei\ttwo\n")
    assert data.read_tsv(reversed_columns, "en", "de") == [("one", "eins"), ("two", "zwei")]  # header skipped
    assert data.read_tsv(reversed_columns, "de", "en") == [("eins", "one"), ("zwei", "two")]
    three = _write(tmp_path, "c.tsv", "7\teins\tone\n8\tzwei\ttwo\n")
    assert data.read_tsv(three, "en", "de", columns="2,1") == [("one", "eins"), ("two", "zwei")]
    assert data.read_tsv(three, "en", "de") == [("7", "eins"), ("8", "zwei")]  # no header, no setting: 0 and 1
    for bad in ("2", "a,b", "1,1", "-1,0"):
        with pytest.raises(DataError, match="data.tsv_columns"):
            data.read_tsv(three, "en", "de", columns=bad)
    with pytest.raises(DataError, match="holds a header line and no pair"):
        data.read_tsv(_write(tmp_path, "d.tsv", "en\tde\n"), "en", "de")


@pytest.mark.parametrize("layout", ["text", "tsv"])
def test_without_test_files_the_test_split_is_the_dev_split(tmp_path, layout):
    pairs = {"train": "a\tb\nc\td\n", "valid" if layout == "text" else "dev": "e\tf\n"}
    for split, content in pairs.items():
        if layout == "tsv":
            _write(tmp_path, f"{split}.tsv", content)
        else:
            for side, lang in enumerate(("en", "de")):
                _write(tmp_path, f"{split}.{lang}", "".join(line.split("\t")[side] + "\n" for line in content.splitlines()))
    splits = data.load_splits(layout, path=str(tmp_path))
    assert splits["test"] is splits["dev"] and splits["dev"] == [("e", "f")]
    assert data.load_splits(layout, path=str(tmp_path), splits=("test",))["test"] == [("e", "f")]
    if layout == "text":
        _write(tmp_path, "test.en", "g\n")  # one side present: the other's absence is an error, not a fallback
        with pytest.raises(DataError, match="test.de does not exist"):
            data.load_splits(layout, path=str(tmp_path))


def test_a_dev_or_test_split_without_any_reference_is_refused(text_dir):
    (text_dir / "test.de").write_text("\n" * len((text_dir / "test.en").read_text().splitlines()))
    with pytest.raises(DataError, match=r"the test split of .* has \d+ lines but no reference sentence"):
        data.load_splits("text", path=str(text_dir))


def test_empty_corpus_is_rejected(tmp_path):
    with pytest.raises(DataError, match="empty"):
        data.read_parallel_text(_write(tmp_path, "a.en", ""), _write(tmp_path, "a.de", ""))
    with pytest.raises(DataError, match="empty"):
        data.read_tsv(_write(tmp_path, "a.tsv", ""))


def test_invalid_utf8_names_file_and_line(tmp_path):
    source = _write(tmp_path, "train.en", "one\ntwo\n")
    target = _write(tmp_path, "train.de", b"eins\nzw\xffei\n")
    with pytest.raises(DataError, match=r"train\.de line 2 is not valid UTF-8 \(byte 0xff\)"):
        data.read_parallel_text(source, target)


def test_empty_lines_are_dropped_from_training_with_a_count_but_kept_for_evaluation(tmp_path):
    source = _write(tmp_path, "test.en", "one\n\nthree\n   \n")
    target = _write(tmp_path, "test.de", "eins\nzwei\ndrei\nvier\n")
    pairs = data.read_parallel_text(source, target)
    assert pairs == [("one", "eins"), ("", "zwei"), ("three", "drei"), ("", "vier")]  # aligned for eval
    kept, dropped = data.drop_empty_pairs(pairs)
    assert kept == [("one", "eins"), ("three", "drei")] and dropped == 2
    with pytest.raises(DataError, match="no pair"):
        data.drop_empty_pairs([("", "x"), ("y", "")])


def test_lines_split_only_on_newline(tmp_path):
    source = _write(tmp_path, "a.en", "one\u2028still one\r\ntwo\n")
    target = _write(tmp_path, "a.de", "eins\nzwei\n")
    assert data.read_parallel_text(source, target)[0] == ("one\u2028still one", "eins")


def test_tsv_source_and_bad_lines(tmp_path):
    for split in data.SPLITS:
        _write(tmp_path, f"{split}.tsv", "Hello\tHallo\nYes\tJa\n")
    assert data.load_splits("tsv", path=str(tmp_path))["dev"] == [("Hello", "Hallo"), ("Yes", "Ja")]
    assert data.load_splits("tsv", path=str(tmp_path), tsv_columns="1,0")["dev"][1] == ("Ja", "Yes")
    bad = _write(tmp_path, "bad.tsv", "Hello\tHallo\nno tab here\n")
    with pytest.raises(DataError, match=r"bad\.tsv line 2 has 1 tab-separated fields"):
        data.read_tsv(bad)


def test_builtin_source_and_its_reverse_direction():
    splits = data.load_splits("builtin", builtin_sizes=(20, 5, 5))
    assert [len(splits[s]) for s in data.SPLITS] == [20, 5, 5]
    reverse = data.load_splits("builtin", builtin_sizes=(20, 5, 5), source_lang="de", target_lang="en")
    assert reverse["test"] == [(g, e) for e, g in splits["test"]]
    with pytest.raises(DataError, match="en<->de"):
        data.load_splits("builtin", source_lang="en", target_lang="fr")


def test_unknown_source_and_missing_path():
    with pytest.raises(DataError, match=r"^unknown data source 'csv'; use one of 'builtin', 'tfds', 'text', 'tsv'$"):
        data.load_splits("csv")
    with pytest.raises(DataError, match=r"needs a data directory and data.path is empty; set --config.data.path=DIR"):
        data.load_splits("text")



def test_the_run_config_offers_the_sources_read_here_not_a_copy_of_them():
    from transformer_jax.config import SETTINGS

    assert next(setting for setting in SETTINGS if setting.key == "data.source").choices is data.SOURCES


@pytest.fixture
def tfds():
    return pytest.importorskip("tensorflow_datasets")


@pytest.fixture
def mocked_tfds(tfds):
    with tfds.testing.mock_data(num_examples=7):
        yield tfds


def test_tfds_mock_gives_english_to_german_pairs_and_all_splits(mocked_tfds):
    tfds = mocked_tfds
    splits = data.load_splits("tfds")
    assert {s: len(p) for s, p in splits.items()} == {"train": 7, "dev": 7, "test": 7}
    # The builders yield {"de": ..., "en": ...}; read the raw examples to check the direction.
    raw = tfds.data_source(data.TFDS_NAME, split="test")
    expected = [(data._text(raw[i]["en"]), data._text(raw[i]["de"])) for i in range(len(raw))]
    assert splits["test"] == expected and expected[0][0] != expected[0][1]
    reverse = data.load_tfds_split(data.TFDS_NAME, "test", "de", "en")
    assert reverse == [(de, en) for en, de in expected]


def test_tfds_unknown_name_split_or_language_is_a_data_error(mocked_tfds):
    with pytest.raises(DataError, match="unknown TFDS dataset 'wmt99_translate'"):
        data.load_tfds_split("wmt99_translate/de-en", "train", "en", "de")
    with pytest.raises(DataError, match="no split 'newstest2099'"):
        data.load_tfds_split(data.TFDS_NAME, "newstest2099", "en", "de")
    with pytest.raises(DataError, match=r"has no config 'xx-en'; choose one of \[.*'de-en'"):
        data.load_tfds_split("wmt14_translate/xx-en", "train", "en", "de")
    with pytest.raises(DataError, match="languages"):
        data.load_tfds_split(data.TFDS_NAME, "test", "en", "fr")
    with pytest.raises(DataError, match="no TFDS counterpart"):
        data.load_splits("tfds", splits=("valid",))


def test_tfds_unprepared_data_is_a_data_error(tfds, tmp_path):
    with pytest.raises(DataError, match="download_and_prepare"):
        data.load_tfds_split(data.TFDS_NAME, "test", "en", "de", data_dir=str(tmp_path))
