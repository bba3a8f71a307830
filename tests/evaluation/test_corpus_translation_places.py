"""What stands at a bulk output's places (`transformer-jax translate-corpus`): nothing the job did not make is replaced
(a file, a link, a folder, with a failed attempt's parts folder beside it or not); a fault of a place (a directory
where a shard file goes, an immutable folder, a read-only mount, a file where a folder goes) is one line naming the
path and the fix, and loses nothing; a shard another job or another place wrote is translated again; one file named
twice, or an empty --suffix, is one line. Each through the command, in three processes (tests/cli_rows.py): the
first attempts, the reruns, and the reruns once each obstacle is gone."""

import contextlib
import os
import pathlib
import shutil
import subprocess

from runs import assert_one_line_error, run_rows
from test_corpus_translation import write_corpus

SHARD_LINES = 20
# Attempts that fail at a line that is not UTF-8 (in shard 2), leaving a parts folder with shards 0 and 1, whose lines
# are the same 20 lines twice; then the input is mended.
WITH_PARTS = ["user_file", "shard_dir", "immutable_parts", "foreign", "moved"]


def attempt(workdir, case: pathlib.Path, *extra: str) -> list[str]:
    return ["translate-corpus", f"--workdir={workdir}", f"--input={case / 'in.en'}", f"--shard_lines={SHARD_LINES}",
            "--mode=sample", "--top_k=5", "--seed=2", *extra]


@contextlib.contextmanager
def read_only_mount(path: pathlib.Path):
    """An empty read-only tmpfs at `path` (mounting needs root, as the suite's other disk tests)."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True)


def parts_of(case: pathlib.Path) -> dict[str, bytes]:
    parts = case / "in.en.de.parts"
    return {path.name: path.read_bytes() for path in sorted(parts.iterdir()) if path.is_file()}


def test_nothing_the_job_did_not_make_is_replaced_and_faults_are_one_line(trained_run, tmp_path):
    workdir = trained_run["workdir"]
    lines = write_corpus(tmp_path / "lines.txt", SHARD_LINES + 19, seed=5).read_text().splitlines()
    mended = lines[:SHARD_LINES] * 2 + lines[SHARD_LINES:]  # shards 0 and 1: the same lines
    cases = {name: tmp_path / name for name in [*WITH_PARTS, "source", "clean", "plain", "dangling_link", "folder",
                                                "linked_file", "record", "immutable_dir"]}
    text = "".join(line + "\n" for line in mended).encode()
    cut = len("".join(line + "\n" for line in mended[:2 * SHARD_LINES + 5]).encode())  # in shard 2
    for case in cases.values():
        case.mkdir()
        bad = case.name in [*WITH_PARTS, "source"]
        (case / "in.en").write_bytes(text[:cut] + b"the \xe9t\xe9\n" + text[cut:] if bad else text)
    first = run_rows("transformer-jax", [attempt(workdir, cases[name]) for name in WITH_PARTS]
                     + [attempt(workdir, cases["source"], "--seed=1")], tmp_path)
    for result in first:
        assert_one_line_error(result, "is not valid UTF-8")
    for name in [*WITH_PARTS, "source"]:
        assert sorted(parts_of(cases[name])) == ["000000000.json", "000000000.txt", "000000001.json",
                                                 "000000001.txt", "settings.json"], name
        (cases[name] / "in.en").write_text("".join(line + "\n" for line in mended))

    (cases["user_file"] / "in.en.de").write_text("mine\n")
    os.symlink(tmp_path / "nowhere", cases["dangling_link"] / "in.en.de")
    (cases["folder"] / "in.en.de").mkdir()
    (cases["folder"] / "in.en.de" / "notes").write_text("mine\n")
    for name in ("shard_dir", "immutable_parts"):
        for path in (cases[name] / "in.en.de.parts").glob("000000001.*"):
            path.unlink()
    (cases["shard_dir"] / "in.en.de.parts" / "000000001.txt").mkdir()
    for suffix in (".txt", ".json"):  # another job's shard (seed 1) and this job's shard 0 at shard 1's place
        shutil.copyfile(cases["source"] / f"in.en.de.parts/000000000{suffix}",
                        cases["foreign"] / f"in.en.de.parts/000000000{suffix}")
        shutil.copyfile(cases["moved"] / f"in.en.de.parts/000000000{suffix}",
                        cases["moved"] / f"in.en.de.parts/000000001{suffix}")
    (cases["linked_file"] / "theirs").write_text("theirs\n")
    os.symlink(cases["linked_file"] / "theirs", cases["linked_file"] / "in.en.de")
    (cases["record"] / "in.en.de.json").write_text("{}\n")
    os.symlink(cases["plain"], tmp_path / "link")
    kept = {name: parts_of(cases[name]) for name in ["shard_dir", "immutable_parts"]}
    subprocess.run(["chattr", "+i", cases["immutable_parts"] / "in.en.de.parts", cases["immutable_dir"]], check=True)
    refusals = {
        "user_file": ["in.en.de exists and is not this job's output", "nothing is overwritten: move it away"],
        "dangling_link": ["in.en.de is a symbolic link (to", "nothing is replaced that the job did not make"],
        "folder": ["in.en.de is a directory (or not a regular file), where this job writes its output"],
        "shard_dir": ["in.en.de.parts/000000001.txt is a directory, where a file is written; move it away and run "
                      "the same command again (the shards finished so far are kept"],
        "immutable_parts": ["in.en.de.parts/000000001.json: operation not permitted", "chattr -i",
                            f"make {cases['immutable_parts'] / 'in.en.de.parts'} writable and run the same command"],
        "linked_file": ["in.en.de is a symbolic link (to", "theirs)"],
        "record": ["in.en.de.json exists and is not this job's output"],
        "immutable_dir": [f"{cases['immutable_dir']}: operation not permitted", "make"],
    }
    try:
        with read_only_mount(tmp_path / "mount") as mount:
            others = [
                (attempt(workdir, cases["plain"], f"--output_dir={mount}"),
                 [f"{mount}: read-only file system; make {mount} writable"]),
                (attempt(workdir, cases["plain"], "--suffix="), ["--suffix is empty; pass a name such as de"]),
                (attempt(workdir, cases["plain"], f"--input={cases['plain']}/./in.en"),  # one file, two spellings
                 ["in.en are one file, named twice in this job; name it once"]),
                (attempt(workdir, cases["plain"], f"--input={tmp_path / 'link' / 'in.en'}"),
                 [f"{tmp_path / 'link' / 'in.en'} are one file, named twice"]),
                (attempt(workdir, cases["plain"], f"--output_dir={cases['plain'] / 'in.en' / 'out'}"),
                 [f"{cases['plain'] / 'in.en'} is a file, where a folder goes"]),
            ]
            rows = [attempt(workdir, cases[name]) for name in [*refusals, "foreign", "moved", "clean"]]
            second = run_rows("transformer-jax", rows + [row for row, _ in others], tmp_path)
    finally:
        subprocess.run(["chattr", "-i", cases["immutable_parts"] / "in.en.de.parts", cases["immutable_dir"]])
    for (name, fragments), result in zip(refusals.items(), second):
        line = assert_one_line_error(result, *fragments)
        assert "another translate-corpus job" not in line, line
    for (_, fragments), result in zip(others, second[-len(others):]):
        assert "another translate-corpus job" not in assert_one_line_error(result, *fragments)
    assert os.listdir(cases["plain"]) == ["in.en"] and os.listdir(cases["immutable_dir"]) == ["in.en"]
    # What was the user's is as it was; the shards a fault stopped at are kept.
    assert (cases["user_file"] / "in.en.de").read_text() == "mine\n"
    assert os.readlink(cases["dangling_link"] / "in.en.de") == str(tmp_path / "nowhere")
    assert (cases["folder"] / "in.en.de" / "notes").read_text() == "mine\n"
    assert (cases["linked_file"] / "theirs").read_text() == "theirs\n"
    assert (cases["record"] / "in.en.de.json").read_text() == "{}\n" and not (cases["record"] / "in.en.de").exists()
    for name, parts in kept.items():
        assert {key: value for key, value in parts_of(cases[name]).items() if key.startswith("000000000")} == {
            key: value for key, value in parts.items() if key.startswith("000000000")}, name

    foreign, moved, clean = second[len(refusals):len(refusals) + 3]
    assert foreign.returncode == moved.returncode == clean.returncode == 0, foreign.stderr[-2000:] + moved.stderr
    expected = (cases["clean"] / "in.en.de").read_bytes()
    translated = expected.split(b"\n")
    assert translated[:SHARD_LINES] != translated[SHARD_LINES:2 * SHARD_LINES]  # shard 0's text would not do for 1
    assert (cases["source"] / "in.en.de.parts" / "000000000.txt").read_bytes().split(b"\n")[:-1] != \
        translated[:SHARD_LINES]  # nor another job's shard 0 for this one's
    assert (cases["foreign"] / "in.en.de").read_bytes() == expected and "in.en: shard 0 " in foreign.stderr
    assert (cases["moved"] / "in.en.de").read_bytes() == expected and "in.en: shard 1 " in moved.stderr

    (cases["user_file"] / "in.en.de").rename(cases["user_file"] / "mine")
    (cases["shard_dir"] / "in.en.de.parts" / "000000001.txt").rmdir()
    again = ["user_file", "shard_dir", "immutable_parts"]
    for name, result in zip(again, run_rows("transformer-jax", [attempt(workdir, cases[name]) for name in again],
                                            tmp_path)):
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        assert (cases[name] / "in.en.de").read_bytes() == expected, name
        assert sorted(os.listdir(cases[name])) == sorted(["in.en", "in.en.de", "in.en.de.json"]
                                                         + (["mine"] if name == "user_file" else [])), name
