"""A prepared corpus that is stale or damaged is never used silently: each case through the real train.py.

Stale: the text it was prepared from edited since, keeping its size and time (`cp -p`, `rsync -t`), in the
run's own corpus or given as data.prepared beside a data.path. Damaged: one byte of a token shard (not at an
end of sentence), of dev.json or of test.json (still valid JSON). Each ends in one line naming the file.

The run resumed on edited text is trained once for the module (each case edits the text at the run's own path, then
puts it back); the commands given a prepared corpus run in one process (runs.run_rows: train.py's own flag parsing
and main, one command line after another).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from runs import NO_TEST_TRANSLATION, ROOT, assert_one_line_error, run_rows, run_script, script_env, write_config
from transformer_jax.data.sources import load_splits


def write_text(directory: pathlib.Path) -> pathlib.Path:
    """The smoke run's built-in pairs as text files {train,dev,test}.{en,de} (data.source=text)."""
    directory.mkdir(parents=True)
    splits = load_splits("builtin", builtin_sizes=(600, 16, 16), seed=0)
    for split, pairs in splits.items():
        for side, lang in enumerate(("en", "de")):
            (directory / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs))
    return directory


def edit_keeping_size_and_time(path: pathlib.Path) -> None:
    """Swap two letters of the first line that differ, then give the file its old modification time back."""
    stat = path.stat()
    text = path.read_text()
    first = text.index(" ") + 1  # the start of the second word
    swapped = text[:first] + text[first + 1] + text[first] + text[first + 2:]
    assert swapped != text and len(swapped.encode()) == len(text.encode())
    path.write_text(swapped)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


def flip_a_token_byte(corpus: pathlib.Path) -> None:
    """Change one id of the shard that is not an end of sentence (ids 0-3 are padding, unk, BOS, EOS)."""
    shard = next(corpus.glob("train-*.tokens"))
    data = bytearray(shard.read_bytes())
    position = next(i for i in range(10, len(data), 2) if int.from_bytes(data[i:i + 2], "little") > 3)
    data[position] ^= 0x01
    shard.write_bytes(bytes(data))


def change_a_pair(path: pathlib.Path) -> None:
    """Edit one dev/test sentence, the file staying valid JSON of the same shape."""
    pairs = json.loads(path.read_text())
    pairs[0][1] = pairs[0][1][::-1]
    path.write_text(json.dumps(pairs, ensure_ascii=False))


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A text corpus and a corpus prepared from it."""
    directory = tmp_path_factory.mktemp("stale")
    config, text = write_config(directory), write_text(directory / "text")
    flags = [f"--config={config}", "--config.data.source=text", f"--config.data.path={text}"]
    done = subprocess.run([sys.executable, "-m", "transformer_jax.cli.prepare", *flags,
                           f"--output={directory / 'corpus'}"], cwd=ROOT, env=script_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"dir": directory, "config": config, "text": text, "corpus": directory / "corpus"}


def copy_of(setup, tmp_path, *names):
    copies = {}
    for name in names:
        copies[name] = tmp_path / name
        shutil.copytree(setup[name], copies[name])
    return copies


@pytest.fixture(scope="module")
def own_text_run(text_run):
    """A run trained 2 steps on its own text files (data.source=text): {"text": their directory, "workdir": the run,
    "flags": the command's flags but --workdir}."""
    text = write_text(text_run["dir"] / "own_text")
    flags = [f"--config={text_run['config']}", "--config.data.source=text", f"--config.data.path={text}"]
    first = run_script("train.py", *flags, f"--workdir={text_run['dir'] / 'own_run'}",
                       "--config.training.num_train_steps=2", NO_TEST_TRANSLATION)
    assert first.returncode == 0, first.stderr[-3000:]
    return {"text": text, "workdir": text_run["dir"] / "own_run", "flags": flags}


@pytest.mark.parametrize("edited", ["train.en", "dev.de"])
def test_a_run_resumed_on_edited_text_of_the_same_size_and_time_is_refused(own_text_run, tmp_path, edited):
    text = own_text_run["text"]  # the run's own text, at its own path (put back as it was after the case)
    workdir = tmp_path / "run"
    shutil.copytree(own_text_run["workdir"], workdir)
    original, stat = (text / edited).read_bytes(), (text / edited).stat()
    edit_keeping_size_and_time(text / edited)
    try:
        result = run_script("train.py", *own_text_run["flags"], f"--workdir={workdir}",
                            "--config.training.num_train_steps=4")
    finally:
        (text / edited).write_bytes(original)
        os.utime(text / edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert_one_line_error(result, f"the files in data.path={text} changed since", f"({edited} differ)",
                          "restore them")


BESIDE_OTHER_TEXT = ["train.en", "test.de"]
DAMAGES = [
    (flip_a_token_byte, "holds tokens that do not match its index (damaged shard)"),
    (lambda corpus: change_a_pair(corpus / "dev.json"), "dev.json changed since the corpus was prepared"),
    (lambda corpus: change_a_pair(corpus / "test.json"), "test.json changed since the corpus was prepared"),
]
DAMAGE_IDS = ["token shard", "dev.json", "test.json"]


@pytest.fixture(scope="module")
def prepared_runs(text_run):
    """The train.py commands given text_run's corpus (or a damaged copy of it) as data.prepared, all in one process
    (runs.run_rows): {"beside": {edited file: (the text copy, the refusal, its workdir)}, "taken": the same corpus
    beside an unedited copy of its text, "damaged": {the line's fragment: (the refusal, its workdir)}}."""
    directory = text_run["dir"] / "prepared_runs"
    directory.mkdir()
    base = [f"--config={text_run['config']}", "--config.data.source=text"]
    rows, beside, damaged = [], {}, {}
    for edited in BESIDE_OTHER_TEXT:
        case = directory / f"beside_{edited}"
        copies = copy_of(text_run, case, "text")
        edit_keeping_size_and_time(copies["text"] / edited)
        beside[edited] = (copies["text"], case / "new")
        rows.append([*base, f"--config.data.path={copies['text']}", f"--config.data.prepared={text_run['corpus']}",
                     f"--workdir={case / 'new'}"])
    # The same corpus beside the text it was prepared from (a copy elsewhere, its times new).
    same = directory / "same"
    shutil.copytree(text_run["text"], same, copy_function=shutil.copyfile)
    rows.append([*base, f"--config.data.path={same}", f"--config.data.prepared={text_run['corpus']}",
                 f"--workdir={directory / 'ok'}", "--config.training.num_train_steps=1"])
    for (damage, named), name in zip(DAMAGES, DAMAGE_IDS):
        case = directory / f"damaged_{name}"
        copies = copy_of(text_run, case, "corpus")
        damage(copies["corpus"])
        damaged[named] = case / "new"
        # One batch holds every pair (shards are checked pair by pair as they are read: this run reads them all).
        rows.append([*base, f"--config.data.prepared={copies['corpus']}", f"--workdir={case / 'new'}",
                     "--config.data.tokens_per_batch=16384", "--config.training.num_train_steps=2"])
    results = run_rows("train.py", rows, directory)
    return {"beside": {edited: (text, results[i], new) for i, (edited, (text, new)) in enumerate(beside.items())},
            "taken": results[len(beside)],
            "damaged": {name: (results[len(beside) + 1 + i], new) for i, (name, new) in enumerate(damaged.items())}}


@pytest.mark.parametrize("edited", BESIDE_OTHER_TEXT)
def test_a_prepared_corpus_beside_other_text_than_it_was_prepared_from_is_refused(prepared_runs, edited):
    text, result, new = prepared_runs["beside"][edited]
    assert_one_line_error(result, f"the files in data.path={text} are not the ones", f"({edited} differ)")
    assert not new.exists()
    # The same corpus beside the text it was prepared from (a copy elsewhere, its times new) is taken.
    fine = prepared_runs["taken"]
    assert fine.returncode == 0, fine.stderr[-3000:]


@pytest.mark.parametrize("damage, named", DAMAGES, ids=DAMAGE_IDS)
def test_a_damaged_prepared_corpus_is_refused_naming_the_file(prepared_runs, damage, named):
    result, new = prepared_runs["damaged"][named]
    assert_one_line_error(result, named, "prepare it again")
    assert not new.exists()  # a first start that saved nothing leaves nothing
