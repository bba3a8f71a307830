"""Bulk translation (`transformer-jax translate-corpus`): an output the same bytes after SIGKILLs at random points as
without them, with one process and with two (two processes' the bytes of one); bad input named in one line, nothing
overwritten. Inputs edited during a job: test_corpus_translation_edits.py; what stands at an output's places:
test_corpus_translation_places.py."""

import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from runs import ROOT, assert_one_line_error, free_port, run_rows, script_env

SHARD_LINES = 40
WORDS = "the a dog cat house tree sleeps runs sees big small red green over under and".split()


def write_corpus(path: pathlib.Path, lines: int, seed: int = 0) -> pathlib.Path:
    """`lines` sentences of 0 to 24 words (every 37th empty), as monolingual text is."""
    rng = random.Random(seed)
    path.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)) if i % 37) + "\n"
                            for i in range(lines)))
    return path


def command(workdir, corpus, out, *extra, process: tuple[int, int, int] | None = None) -> list[str]:
    cluster = []
    if process is not None:
        index, count, port = process
        cluster = ["--multihost", f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={count}",
                   f"--process_id={index}"]
    return [sys.executable, "-m", "transformer_jax", "translate-corpus", f"--workdir={workdir}", f"--input={corpus}",
            f"--output_dir={out}", f"--shard_lines={SHARD_LINES}", *extra, *cluster]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run_job(workdir, corpus, out, *extra, processes: int = 1) -> list[tuple[str, str]]:
    """The job to its end (all its processes), each exiting 0; their (stdout, stderr)."""
    port = free_port()
    jobs = [start(command(workdir, corpus, out, *extra, process=(i, processes, port) if processes > 1 else None))
            for i in range(processes)]
    results = [job.communicate(timeout=600) for job in jobs]
    for job, (_, stderr) in zip(jobs, results):
        assert job.returncode == 0, stderr[-3000:]
    return results


def kill_when(workdir, corpus, out, parts: pathlib.Path, shards: int, delay: float, *extra,
              processes: int = 1) -> bool:
    """Start the job and SIGKILL all its processes once `shards` shard files are written (then `delay` s more);
    False if it finished first."""
    port = free_port()
    jobs = [start(command(workdir, corpus, out, *extra, process=(i, processes, port) if processes > 1 else None))
            for i in range(processes)]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and all(job.poll() is None for job in jobs):
        written = len(list(parts.glob("*.txt"))) if parts.is_dir() else 0
        if written >= shards:
            time.sleep(delay)
            break
        time.sleep(0.02)
    finished = all(job.poll() == 0 for job in jobs)
    for job in jobs:
        if job.poll() is None:
            job.send_signal(signal.SIGKILL)
        job.communicate(timeout=60)
    return not finished


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    """mono.en (9 shards), beside it part1.en (2 shards: the bucket's second file)."""
    folder = tmp_path_factory.mktemp("mono")
    write_corpus(folder / "part1.en", SHARD_LINES + 1, seed=1)
    return write_corpus(folder / "mono.en", 8 * SHARD_LINES + 13)


# Two sampling searches (the tiny run's greedy outputs are empty lines: sampling shows the text).
TOP_K, TOP_P = ("--mode=sample", "--top_k=5", "--seed=3"), ("--mode=sample", "--temperature=0.7", "--top_p=0.9")


@pytest.fixture(scope="module")
def never_stopped(trained_run, corpus, tmp_path_factory):
    """`whole(search)`: the output folder of the one-process job on `corpus` run to its end without a stop, made once
    per module (the killed jobs' reference, of one process and of two; the bucket's job with TOP_K shares it: with
    TOP_K the job translates part1.en too, saving the bucket's test a launch of its own)."""
    made: dict[tuple[str, ...], pathlib.Path] = {}

    def whole(search: tuple[str, ...]) -> pathlib.Path:
        if search not in made:
            out = tmp_path_factory.mktemp("whole")
            also = [f"--input={corpus.parent / 'part1.en'}"] if search == TOP_K else []
            run_job(trained_run["workdir"], corpus, out, *also, *search)
            made[search] = out
        return made[search]

    return whole


# (processes, search, kills): the one-process job is killed 3 times, after 1 to 9 shards (a resumed job killed again,
# maybe while joining, at least 2 landing before it finished); the two-process job once, after 1 to 6 shards, with 3 or
# more still to go, so that it lands before the job finished: one kill proves that two processes' shards resume to the
# bytes of one never stopped (each kill of it costs two start-ups).
@pytest.mark.parametrize("processes, search, kills", [(1, TOP_K, 3), (2, TOP_P, 1)])
def test_a_job_killed_at_random_points_ends_with_the_bytes_of_one_never_stopped(trained_run, corpus, never_stopped,
                                                                                  tmp_path, processes, search, kills):
    """The reference is the one-process job never stopped, for the two-process job too: a shard is translated the same
    by any process (its samples drawn from its own seed), so two processes' output is one process's."""
    workdir = trained_run["workdir"]
    whole = never_stopped(search)
    expected = (whole / "mono.en.de").read_bytes()
    assert expected.count(b"\n") == 8 * SHARD_LINES + 13
    assert len(set(expected.split(b"\n"))) > 100  # translations, not a column of empty lines

    out, parts = tmp_path / "killed", tmp_path / "killed" / "mono.en.de.parts"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    landed = 0
    points = range(1, 10) if kills > 1 else range(1, 7)  # shards written: at 9, killed while joining
    for shards in sorted(rng.sample(points, kills)):
        landed += kill_when(workdir, corpus, out, parts, shards, rng.uniform(0, 0.3), *search, processes=processes)
    assert landed >= max(kills - 1, 1), f"the job finished before most kills (seed {seed})"
    stderrs = [stderr for _, stderr in run_job(workdir, corpus, out, *search, processes=processes)]
    assert (out / "mono.en.de").read_bytes() == expected, f"seed {seed}"
    record = json.loads((out / "mono.en.de.json").read_text())
    assert record == json.loads((whole / "mono.en.de.json").read_text())
    assert record["lines"] == 8 * SHARD_LINES + 13 and record["empty"] == len([i for i in range(333) if i % 37 == 0])
    assert not parts.exists() and sorted(os.listdir(out)) == ["mono.en.de", "mono.en.de.json"]
    redone = sum(stderr.count("mono.en: shard ") for stderr in stderrs)
    assert redone < 9 or "already translated" in "".join(stderrs), f"the rerun started over (seed {seed})"


def arrange_bad_input(workdir, tmp_path: pathlib.Path) -> list[tuple[list[str], list[str]]]:
    """test_bad_input_is_one_line_and_nothing_is_overwritten's files; its (command line, error fragments) rows."""
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"the dog\nthe cat\nthe \xe9t\xe9\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "mono.en.de").write_text("someone's file\n")
    mono = write_corpus(tmp_path / "mono.en", 5)
    (tmp_path / "x").mkdir()
    write_corpus(tmp_path / "x" / "mono.en", 5, seed=1)
    # The run's config alone, no tokenizer or checkpoint: the inputs and places are checked before the model loads.
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    shutil.copy(pathlib.Path(workdir) / "config.json", config_only)
    rows = [
        ([f"--input={bad}", f"--output_dir={tmp_path / 'out'}"], [f"{bad} line 3 is not valid UTF-8"]),
        ([f"--input={mono}", f"--output_dir={theirs}"], ["mono.en.de exists and is not this job's output",
                                                          "nothing is overwritten"]),
        ([f"--input={tmp_path / '*.fr'}"], ["matches no file"]),
        ([f"--input={mono}", "--shard_lines=0"], ["--shard_lines=0 must be at least 1"]),
        ([f"--input={mono}", f"--input={tmp_path / 'x' / 'mono.en'}", f"--output_dir={tmp_path / 'out'}"],
         ["two inputs would write"]),
        ([f"--workdir={config_only}", f"--input={mono}", f"--input={tmp_path / 'x' / 'mono.en'}",
          f"--output_dir={tmp_path / 'out'}"], ["two inputs would write"]),
    ]
    return [(["translate-corpus", f"--workdir={workdir}", *args], fragments) for args, fragments in rows]


def arrange_finished_output(workdir, tmp_path: pathlib.Path) -> list[list[str]]:
    """test_a_finished_output_is_kept_and_other_settings_are_refused's input; its command lines, in order."""
    mono = write_corpus(tmp_path / "mono.en", 7)
    rows = [["translate-corpus", f"--workdir={workdir}", f"--input={mono}", "--mode=greedy"]] * 2
    rows.append(["translate-corpus", f"--workdir={workdir}", f"--input={mono}", "--mode=beam"])
    return rows


def arrange_not_the_jobs(workdir, tmp_path: pathlib.Path) -> list[tuple[list[str], list[str]]]:
    """test_what_is_not_the_jobs_is_refused_in_one_line_and_left_as_it_is's places (its claimed output is claimed
    while the rows run: one_process_rows); its (command line, error fragments) rows."""
    mono = write_corpus(tmp_path / "mono.en", 5)
    theirs = tmp_path / "theirs"
    (theirs / "mono.en.de.parts").mkdir(parents=True)
    (theirs / "mono.en.de.parts" / "notes.txt").write_text("mine\n")
    a_file = tmp_path / "a_file"
    (a_file / "mono.en.de.parts").parent.mkdir()
    (a_file / "mono.en.de.parts").write_text("mine too\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("not a directory\n")
    claimed = tmp_path / "claimed"
    rows = [
        ([f"--output_dir={theirs}"], ["mono.en.de.parts exists but is not a translate-corpus parts folder",
                                       "nothing in it is read or removed"]),
        ([f"--output_dir={a_file}"], ["mono.en.de.parts exists but is not a translate-corpus parts folder"]),
        ([f"--output_dir={plain}"], ["is a file; pass a directory"]),
        ([f"--output_dir={tmp_path / 'out'}", "--suffix=a/b"], ["--suffix='a/b' must be a plain name"]),
        ([f"--output_dir={claimed}"], ["mono.en.de is in use by another translate-corpus job", f"pid {os.getpid()}"]),
        ([f"--input={tmp_path}", f"--output_dir={tmp_path / 'out'}"], ["is a directory, not a text file"]),
    ]
    return [(["translate-corpus", f"--workdir={workdir}", f"--input={mono}", *args], fragments)
            for args, fragments in rows]


@pytest.fixture(scope="module")
def one_process_rows(trained_run, tmp_path_factory) -> dict:
    """The command lines of the three tests below, run in one process (runs.run_rows: one start-up of Python, JAX and
    the model instead of three), each test's in a folder of its own: {test: (its folder, its rows, their results)}.
    The rows keep each test's order (the finished output's three run one after another)."""
    from transformer_jax.base.lock import Claim

    workdir = trained_run["workdir"]
    base = tmp_path_factory.mktemp("one_process_rows")
    folders = {name: base / name for name in ("bad_input", "finished_output", "not_the_jobs")}
    for folder in folders.values():
        folder.mkdir()
    rows = {"bad_input": arrange_bad_input(workdir, folders["bad_input"]),
            "finished_output": [(row, []) for row in arrange_finished_output(workdir, folders["finished_output"])],
            "not_the_jobs": arrange_not_the_jobs(workdir, folders["not_the_jobs"])}
    claimed = folders["not_the_jobs"] / "claimed"
    claim = Claim(str(claimed / "mono.en.de.lock"), str(claimed / "mono.en.de"), "translate-corpus job",
                  "--output_dir")
    claim.acquire(heartbeat=False)  # this test process: alive, so the claim holds
    try:
        results = run_rows("transformer-jax", [row for name in rows for row, _ in rows[name]], base)
    finally:
        claim.release()
    made, start = {}, 0
    for name, named_rows in rows.items():
        made[name] = (folders[name], named_rows, results[start:start + len(named_rows)])
        start += len(named_rows)
    return made


def test_bad_input_is_one_line_and_nothing_is_overwritten(one_process_rows):
    tmp_path, rows, results = one_process_rows["bad_input"]
    theirs = tmp_path / "theirs"
    for (_, fragments), result in zip(rows, results, strict=True):
        assert_one_line_error(result, *fragments)
    assert (theirs / "mono.en.de").read_text() == "someone's file\n" and os.listdir(theirs) == ["mono.en.de"]
    # The failed first attempt wrote no output and no parts folder that would pin its settings for the next.
    assert not (tmp_path / "out" / "bad.en.de").exists() and not (tmp_path / "out" / "bad.en.de.parts").exists()


def test_a_finished_output_is_kept_and_other_settings_are_refused(one_process_rows):
    tmp_path, _, (first, again, other) = one_process_rows["finished_output"]
    assert first.returncode == again.returncode == 0, first.stderr[-2000:] + again.stderr[-2000:]
    assert "already translated" in again.stderr
    assert_one_line_error(other, "mono.en.de was translated with other settings (search)")
    assert len((tmp_path / "mono.en.de").read_text().splitlines()) == 7  # beside its input


def test_what_is_not_the_jobs_is_refused_in_one_line_and_left_as_it_is(one_process_rows):
    """A folder or file where the parts go, an --output_dir that is a file, a suffix with a /, an output another job
    claims: one line each, and nothing there is read, changed or removed."""
    tmp_path, rows, results = one_process_rows["not_the_jobs"]
    theirs, a_file, plain, claimed = (tmp_path / name for name in ("theirs", "a_file", "plain.txt", "claimed"))
    for (_, fragments), result in zip(rows, results, strict=True):
        assert_one_line_error(result, *fragments)
    assert os.listdir(theirs / "mono.en.de.parts") == ["notes.txt"]
    assert (theirs / "mono.en.de.parts" / "notes.txt").read_text() == "mine\n"
    assert (a_file / "mono.en.de.parts").read_text() == "mine too\n" and os.listdir(a_file) == ["mono.en.de.parts"]
    assert plain.read_text() == "not a directory\n"
    assert sorted(os.listdir(claimed)) == []  # the claim released; the refused job wrote nothing
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_a_glob_in_a_bucket_is_translated_into_the_bucket_and_resumed(trained_run, corpus, never_stopped,
                                                                      gcs_emulator, tmp_path):
    """gs:// inputs (a glob) and --output_dir, on a local GCS emulator: a killed job, its glob then gaining a file that
    comes first, goes on to the bytes of a whole one (sampling seeds follow each file's name, not its place in the
    glob, nor where the file is), and the bucket holds only the outputs and their records. The whole ones are local
    jobs never stopped on files of the same names and lines: the module's (never_stopped, TOP_K), on the corpus
    folder's mono.en and part1.en (there the second of two named inputs, here the third file of a glob); no job of
    their own in the bucket."""
    import uuid

    import fsspec
    from gcs_emulator import BUCKET, emulator_in_this_process

    root = f"gs://{BUCKET}/corpus-{uuid.uuid4().hex[:8]}"
    local = [corpus, corpus.parent / "part1.en"]  # mono.en (9 shards), part1.en (2)
    with emulator_in_this_process(gcs_emulator):
        bucket = fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)
        for path in local:
            bucket.pipe_file(f"{root}/in/{path.name}", path.read_bytes())
    env = script_env(**gcs_emulator)

    def job(out: str) -> subprocess.Popen:
        return subprocess.Popen(command(trained_run["workdir"], f"{root}/in/*.en", out, *TOP_K), cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    whole = never_stopped(TOP_K)
    stopped = job(f"{root}/resumed")
    with emulator_in_this_process(gcs_emulator):
        bucket = fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)
        parts = f"{root}/resumed/mono.en.de.parts".removeprefix("gs://")
        deadline = time.monotonic() + 300
        while stopped.poll() is None and time.monotonic() < deadline and not bucket.glob(f"{parts}/*.txt"):
            time.sleep(0.1)  # until mono.en's first shard is in the bucket: 8 of its 9 to go
        assert stopped.poll() is None, "the job finished before it was killed: " + stopped.stderr.read()[-3000:]
        stopped.send_signal(signal.SIGKILL)
        stopped.communicate()
        bucket.pipe_file(f"{root}/in/added.en", write_corpus(tmp_path / "added.en", 5, seed=7).read_bytes())
    resumed = job(f"{root}/resumed")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()[-3000:]
    with emulator_in_this_process(gcs_emulator):
        bucket = fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)
        names = sorted(path.rsplit("/", 1)[-1] for path in bucket.find(f"{root}/resumed".removeprefix("gs://")))
        assert names == ["added.en.de", "added.en.de.json", "mono.en.de", "mono.en.de.json", "part1.en.de",
                         "part1.en.de.json"]
        output = bucket.cat_file(f"{root}/resumed/mono.en.de")
        assert output == (whole / "mono.en.de").read_bytes() and output.count(b"\n") == 8 * SHARD_LINES + 13
        second = bucket.cat_file(f"{root}/resumed/part1.en.de")
    assert second == (whole / "part1.en.de").read_bytes()
    assert second.count(b"\n") == SHARD_LINES + 1


def test_the_model_is_named_by_its_parameters_and_tokenizer(trained_run):
    """A job's settings name the model that translates: the same run gives the same name, a changed parameter
    another (so a checkpoint replaced between attempts is refused like any other change of settings)."""
    import jax

    from transformer_jax.evaluation import Translator

    with Translator(str(trained_run["workdir"])) as first, Translator(str(trained_run["workdir"])) as second:
        assert first.fingerprint() == second.fingerprint()
        second.params = jax.tree.map(lambda x: x * 1.001, second.params)
        assert first.fingerprint() != second.fingerprint()
