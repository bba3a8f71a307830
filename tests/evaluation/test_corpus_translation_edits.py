"""What a bulk output is bound to (`evaluation.corpus_translation`): inputs edited at random moments of a job (lines
changed, inserted, deleted, appended; files added to the glob), its parts damaged or shards moved between attempts,
and the job stopped; every rerun ends in the bytes of a clean job over the input as it is at the end, or in a
one-line refusal. A join cut between its record and its output; and the issue's probe through the command: a line
of the input emptied while the job runs."""

import os
import pathlib
import random
import shutil
import subprocess
import time

import pytest

from runs import ROOT, run_rows, script_env
from test_corpus_translation import command, write_corpus

LINES = 16  # lines a shard: whole shards of 16 keep the search to few shapes (rows of 16, 15, 17 or 1)


class Stopped(Exception):
    """A stop in the middle of a job (as SIGKILL leaves it: the shards written so far)."""


class EditingTranslator:
    """A Translator that, before its n-th translate call (counted over every attempt), makes the edit planned for n,
    and stops the job at call `stop`: the edits come while a pass is reading the input, its file still open. Its
    translations are kept by (lines, search) in `known`, shared by the clean jobs: the model translates the same
    lines with the same search to the same text, which the reruns of test_corpus_translation.py check."""

    def __init__(self, translator, edits: dict, stop: int | None, calls: list[int], known: dict):
        self.translator, self.edits, self.stop, self.calls, self.known = translator, edits, stop, calls, known

    def __getattr__(self, name):
        return getattr(self.translator, name)

    def translate(self, lines, **search):
        call = self.calls[0]
        self.calls[0] += 1
        if call in self.edits:
            self.edits.pop(call)()
        if call == self.stop:
            raise Stopped
        key = (tuple(lines), tuple(sorted(search.items())))
        if key not in self.known:
            self.known[key] = self.translator.translate(lines, **search)
        return self.known[key]


def edit(rng: random.Random, folder: pathlib.Path, out: pathlib.Path, log: list) -> None:
    """One random edit of the glob's files, in place (an open reader sees the new bytes from its offset on); logs
    (kind, file, whether that file's output was finished then)."""
    files = sorted(folder.glob("*.en"))
    kind = rng.choice(["change", "insert", "delete", "append", "add", "none"])
    path = rng.choice(files)
    if kind == "add":  # a name that sorts first: every other file moves in the expanded list
        path = folder / f"a{len(files)}.en"
        write_corpus(path, LINES, seed=len(files) + 50)
    elif kind != "none":
        lines = path.read_text().splitlines()
        at = rng.randrange(len(lines))
        if kind == "change":
            lines[at] = lines[at] + " big"
        elif kind == "insert":
            lines.insert(at, "the red dog")
        elif kind == "delete":
            del lines[at]
        else:
            lines.append("a small cat")
        path.write_text("".join(line + "\n" for line in lines))
    log.append((kind, path.name, (out / f"{path.name}.de.json").exists()))


def damage(rng: random.Random, out: pathlib.Path) -> str:
    """One random damage to the parts folders between attempts: a shard file cut, removed, added to, emptied, or a
    shard's files copied over another shard's (same job, another place); returns what it did."""
    files = sorted(out.glob("*.parts/0*"))
    if not files:
        return "no parts"
    victim = rng.choice(files)
    kind = rng.choice(["truncate", "delete", "garbage", "empty", "move", "none"])
    if kind == "truncate":
        victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])
    elif kind == "delete":
        victim.unlink()
    elif kind == "garbage":
        victim.write_bytes(victim.read_bytes() + b"spam\n")
    elif kind == "empty":
        victim.write_bytes(b"")
    elif kind == "move":
        others = sorted({path.stem for path in victim.parent.glob("0*")} - {victim.stem})
        target = rng.choice(others) if others else victim.stem
        for suffix in (".txt", ".json") if others else ():
            if (victim.parent / f"{victim.stem}{suffix}").exists():
                shutil.copyfile(victim.parent / f"{victim.stem}{suffix}", victim.parent / f"{target}{suffix}")
    return f"{kind} {victim.parent.name}/{victim.name}"


SEARCH = {"mode": "sample", "top_k": 5, "seed": 1}


@pytest.fixture(scope="module")
def translator(trained_run):
    """The tiny run's Translator, its translations kept by (lines, search) across this module's jobs."""
    from transformer_jax.evaluation import Translator

    with Translator(str(trained_run["workdir"])) as loaded:
        yield EditingTranslator(loaded, {}, None, [0], {})


def job(translator, pattern: str, out: pathlib.Path) -> None:
    """A job over the files `pattern` names, its outputs in `out` (the library call the command makes)."""
    from transformer_jax.evaluation.corpus_translation import expand_inputs, plan_files, translate_corpus

    files = plan_files(expand_inputs([pattern]), str(out), "de")
    translate_corpus(translator, files, {"job": "property", "search": SEARCH}, SEARCH, shard_lines=LINES,
                     say=lambda line: None)


def test_inputs_edited_during_a_job_end_in_a_clean_jobs_bytes_or_a_refusal(translator, tmp_path):
    """Property: a job over a glob whose files are edited at random moments while it reads and translates them (and
    between attempts), its parts damaged and shards moved between attempts, stopped at a random shard, then run
    again until an attempt sees no edit, ends with each output the bytes of a clean job over that file as it now is
    (whatever its place in the glob: sampling seeds follow the file's name); or an attempt stops in one line: "changed
    while it was being translated" only in an attempt that edited that file (nothing joined; the next one goes on),
    "changed since" only for a file edited after its output was finished (nothing of the user's changed)."""
    from transformer_jax.errors import ConfigError, DataError

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    outcomes = set()
    for trial in range(6):
        work = tmp_path / f"trial{trial}"
        folder, out = work / "in", work / "out"
        folder.mkdir(parents=True)
        for index in range(rng.randint(1, 2)):
            write_corpus(folder / f"m{index}.en", 2 * LINES, seed=10 * trial + index)
        shards = sum(len(path.read_text().splitlines()) // LINES for path in folder.glob("*.en"))
        log: list = []
        edits = {call: (lambda: edit(rng, folder, out, log)) for call in rng.sample(range(shards + 2), 3)}
        stop, calls = rng.choice([None, *range(shards)]), [0]
        what = f"seed {seed}, trial {trial}"
        refused = None
        for _ in range(10):  # attempts
            edited_before, kept = len(log), {p.name: p.read_bytes() for p in out.glob("*.de*") if p.is_file()}
            try:
                editing = EditingTranslator(translator.translator, edits, stop, calls, translator.known)
                job(editing, str(folder / "*.en"), out)
            except Stopped:
                what += f"; stopped at call {calls[0] - 1}, {damage(rng, out)}"
                continue
            except DataError as error:  # an input edited during this attempt: nothing joined
                assert "\n" not in str(error) and "changed while it was being translated" in str(error), what
                assert any(name in str(error) for _, name, _ in log[edited_before:]), f"{what}: {error}"
                what += f"; {log[edited_before:]}: stopped before the join"
                continue
            except ConfigError as error:  # a finished output whose input was edited since
                assert "\n" not in str(error) and "changed since" in str(error), f"{what}: {error}"
                assert any(done and name in str(error) for kind, name, done in log if kind != "none"), what
                assert {p.name: p.read_bytes() for p in out.glob("*.de*") if p.is_file()} == kept, what
                refused = error
                break
            if len(log) == edited_before:  # an attempt that saw no edit: the job is done
                break
        outcomes.add("refused" if refused else "done")
        if refused:
            continue
        assert not list(out.glob("*.parts")), what  # (an edit planned past the job's last call never came)
        job(translator, str(folder / "*.en"), work / "clean")
        for path in sorted(folder.glob("*.en")):
            output = (out / f"{path.name}.de").read_bytes()
            assert output == (work / "clean" / f"{path.name}.de").read_bytes(), f"{what}: {path.name}"
            assert output.count(b"\n") == len(path.read_text().splitlines()), what
    assert "done" in outcomes, f"seed {seed}: no trial ended in an output"


def test_a_join_cut_between_its_record_and_its_output_is_done_again_never_taken_for_the_users_file(
        translator, tmp_path, monkeypatch):
    """`<output>.json` is written before `<output>`: a join stopped between them (as SIGKILL can) leaves a record and
    the parts; a file the user then puts at `<output>` is refused, not taken for the output nor replaced; once it is
    gone, the same job writes the bytes of a clean one."""
    from transformer_jax.errors import ConfigError
    from transformer_jax.evaluation import corpus_translation

    (tmp_path / "in").mkdir()
    write_corpus(tmp_path / "in" / "cut.en", 2 * LINES + 3)
    out, output = tmp_path / "out", tmp_path / "out" / "cut.en.de"

    def stopped(path, chunks):
        raise Stopped

    with monkeypatch.context() as patch:
        patch.setattr(corpus_translation, "write_streamed", stopped)
        with pytest.raises(Stopped):
            job(translator, str(tmp_path / "in" / "*.en"), out)
    assert sorted(os.listdir(out)) == ["cut.en.de.json", "cut.en.de.parts"]
    output.write_text("mine\n")
    with pytest.raises(ConfigError, match="cut.en.de is not the text its .json records") as refused:
        job(translator, str(tmp_path / "in" / "*.en"), out)
    assert "\n" not in str(refused.value) and output.read_text() == "mine\n"
    output.unlink()
    job(translator, str(tmp_path / "in" / "*.en"), out)
    job(translator, str(tmp_path / "in" / "*.en"), tmp_path / "clean")
    assert output.read_bytes() == (tmp_path / "clean" / "cut.en.de").read_bytes()
    assert sorted(os.listdir(out)) == ["cut.en.de", "cut.en.de.json"]


def test_an_input_edited_while_the_command_runs_is_redone_not_vouched_for(trained_run, tmp_path):
    """The issue's probe: a line of the first shard emptied (in place: the job's reader, 8 KB ahead, reads the rest
    from the new bytes) after 2 of 6 shards; the job stops before the join in one line, nothing joined; the same
    command then ends with the bytes of a job over the new input that never stopped."""
    workdir, out = trained_run["workdir"], tmp_path / "out"
    corpus = write_corpus(tmp_path / "mono.en", 6 * 40 - 7)
    running = subprocess.Popen(command(workdir, corpus, out, "--mode=sample", "--seed=4"), cwd=ROOT, env=script_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(list(out.glob("mono.en.de.parts/*.txt"))) < 2 and running.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = corpus.read_text().splitlines()
    assert lines[1]
    corpus.write_text("".join(line + "\n" for line in [lines[0], "", *lines[2:]]))
    _, stderr = running.communicate(timeout=300)
    assert running.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("error: ")] == [
        f"error: {corpus} changed while it was being translated, so {out / 'mono.en.de'} is not written; run the same "
        "command again (the shards finished so far are kept in each output's .parts folder): it translates again the "
        "shards whose lines changed"]
    assert not (out / "mono.en.de").exists() and not (out / "mono.en.de.json").exists()
    rows = [command(workdir, corpus, folder, "--mode=sample", "--seed=4")[3:] for folder in (out, tmp_path / "clean")]
    again, clean = run_rows("transformer-jax", rows, tmp_path)
    assert again.returncode == clean.returncode == 0, again.stderr[-2000:] + clean.stderr[-2000:]
    assert again.stderr.count("mono.en: shard ") < 6  # the shards of unchanged lines kept
    output = (out / "mono.en.de").read_bytes()
    assert output == (tmp_path / "clean" / "mono.en.de").read_bytes() and output.count(b"\n") == 6 * 40 - 7
    assert len(set(output.split(b"\n"))) > 100  # translations, not a column of empty lines
