"""Translating whole corpora (millions of lines) resumably, over every process of a job.

Each input file is read a line at a time, in shards of `shard_lines` lines; shard k of a file goes to process
k mod (processes), which translates it with its own devices (`Translator`: sorted by length, token-budget
batches) and writes it whole into `<output>.parts/` (write-then-rename), with its counts beside it. A shard
whose file is there is done: a job stopped anywhere (SIGTERM, SIGKILL, a preempted VM) and started again with
the same command goes on from the first unfinished shard. The process that finds every shard of a file written
joins them into `<output>` (written whole), records the settings and counts in `<output>.json` and removes the
parts; the result is the same bytes as an uninterrupted job's.

Sampling draws from a seed derived from (--seed, the file's place, the shard), each line from that seed folded with
its place in the shard: the same shards give the same samples whichever process, or which attempt, translates
them, on however many devices. Nothing is overwritten: an output that exists and
is not this job's (no matching `.json` or `.parts/` settings) stops the job before any work.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
from typing import Any, Callable, Iterator

import numpy as np
from etils import epath

from transformer_jax.base.files import (exists, is_dir, is_local, list_names, make_dirs, read_text, remove,
                                        write_atomically, write_streamed)
from transformer_jax.data.sources import stream_lines
from transformer_jax.errors import ConfigError, DataError
from transformer_jax.evaluation.translator import Translator

PARTS = ".parts"  # <output>.parts/: the shards written so far, and the job's settings
SETTINGS = "settings.json"
RECORD = ".json"  # <output>.json: the settings and counts of a finished output


@dataclasses.dataclass(frozen=True)
class CorpusFile:
    """One input file and the output its translation goes to."""

    input: str
    output: str

    @property
    def parts(self) -> str:
        return self.output + PARTS

    @property
    def record(self) -> str:
        return self.output + RECORD


def expand_inputs(patterns: list[str]) -> list[str]:
    """The files the patterns name (a path, or a glob: local or gs://), sorted within each pattern, each once."""
    files: list[str] = []
    for pattern in patterns:
        if any(char in pattern for char in "*?["):
            if is_local(pattern):
                matched = sorted(glob.glob(pattern))
            else:
                root, _, rest = pattern.partition("://")
                bucket, _, glob_part = rest.partition("/")
                matched = sorted(str(path) for path in epath.Path(f"{root}://{bucket}").glob(glob_part))
            if not matched:
                raise DataError(f"--input {pattern} matches no file; check the pattern")
            files += matched
        else:
            files.append(pattern)
    return list(dict.fromkeys(files))


def plan_files(inputs: list[str], output_dir: str | None, suffix: str) -> list[CorpusFile]:
    """Each input with its output: `<input>.<suffix>` beside it, or `<output_dir>/<input's name>.<suffix>`."""
    planned = []
    for path in inputs:
        name = os.path.basename(path.rstrip("/")) + f".{suffix}"
        planned.append(CorpusFile(path, path + f".{suffix}" if output_dir is None else os.path.join(output_dir, name)))
    outputs = [item.output for item in planned]
    for item in planned:
        if outputs.count(item.output) > 1:
            raise ConfigError(f"two inputs would write {item.output} (the same file name in --output_dir); "
                              "translate them in two jobs, or leave --output_dir out to write beside each input")
        if item.output in inputs:
            raise ConfigError(f"the output {item.output} of {item.input} is an input too; choose another "
                              "--output_dir")
    return planned


def _read_json(path: str) -> dict | None:
    try:
        return json.loads(read_text(path)) if exists(path) else None
    except ValueError:
        return None


def finished(item: CorpusFile, settings: dict) -> bool:
    """Whether `item`'s output is this job's, whole: it exists with a record of the same settings."""
    record = _read_json(item.record)
    return exists(item.output) and record is not None and record.get("settings") == settings


def check_outputs(files: list[CorpusFile], settings: dict) -> None:
    """Before any work: each output is absent, finished by this job, or begun by it (same settings); an output
    that exists otherwise, or a job begun with other settings, is a ConfigError naming it."""
    for item in files:
        if finished(item, settings):
            continue
        begun = _read_json(os.path.join(item.parts, SETTINGS))
        if begun is not None and begun != settings:
            changed = sorted(key for key in set(begun) | set(settings) if begun.get(key) != settings.get(key))
            raise ConfigError(f"{item.parts} holds a translation begun with other settings ({', '.join(changed)}); "
                              "run the same command as before to finish it, or remove that folder to start anew")
        record = _read_json(item.record)
        if begun is None and record is not None and exists(item.output) and "settings" in record:
            changed = sorted(key for key in set(record["settings"]) | set(settings)
                             if record["settings"].get(key) != settings.get(key))
            raise ConfigError(f"{item.output} was translated with other settings ({', '.join(changed)}); nothing is "
                              "overwritten: remove it and its .json, or choose another --output_dir")
        if begun is None and (exists(item.output) or exists(item.record)):
            raise ConfigError(f"{item.output} exists and is not this job's output; nothing is overwritten: remove "
                              "it, or choose another --output_dir")


def shard_seed(seed: int, file_index: int, shard: int) -> int:
    """The sampling seed of one shard: fixed by (seed, file, shard), whichever process translates it."""
    return int(np.random.SeedSequence([seed, file_index, shard]).generate_state(1)[0] % 2**31)


def _shard_name(shard: int) -> str:
    return f"{shard:09d}"


def _shards(item: CorpusFile, shard_lines: int) -> Iterator[tuple[int, list[str], int, int]]:
    """(shard number, its lines, bytes read so far, the file's size) of `item`'s input, read a line at a time."""
    size = 0
    if exists(item.input) and not is_dir(item.input):
        size = os.path.getsize(item.input) if is_local(item.input) else epath.Path(item.input).stat().length
    lines: list[str] = []
    shard, position = 0, 0
    for _, line, position in stream_lines(item.input):
        lines.append(line)
        if len(lines) == shard_lines:
            yield shard, lines, position, size
            shard, lines = shard + 1, []
    if lines:
        yield shard, lines, position, size


def _done_shards(item: CorpusFile) -> set[int]:
    names = list_names(item.parts) if is_dir(item.parts) else []
    return {int(name[:-4]) for name in names if name.endswith(".txt") and name[:-4].isdigit()}


def _join(item: CorpusFile, count: int, settings: dict) -> dict:
    """Write `<output>` from its `count` shards, then its record; remove the parts. Returns the record."""
    totals = {"lines": 0, "empty": 0, "truncated": 0}
    for shard in range(count):
        counts = json.loads(read_text(os.path.join(item.parts, _shard_name(shard) + ".json")))
        for key in totals:
            totals[key] += counts[key]

    def chunks() -> Iterator[bytes]:
        for shard in range(count):
            path = os.path.join(item.parts, _shard_name(shard) + ".txt")
            with (open(path, "rb") if is_local(path) else epath.Path(path).open("rb")) as f:
                while block := f.read(1 << 20):
                    yield block

    write_streamed(item.output, chunks())
    record = {"input": item.input, "settings": settings, **totals}
    write_atomically(item.record, json.dumps(record, indent=2) + "\n")
    for name in sorted(list_names(item.parts) if is_dir(item.parts) else [], key=lambda n: n == SETTINGS):
        try:
            remove(os.path.join(item.parts, name))  # the settings last: a cut removal leaves a resumable record
        except FileNotFoundError:
            pass  # another process joining the same file removed it
    if is_local(item.parts):  # an object store has no folders to remove
        try:
            os.rmdir(item.parts)
        except OSError:
            pass  # another process joining the same file removed it, or has not finished removing its files
    return record


@dataclasses.dataclass
class Progress:
    """Sentences translated by this process and the time they took; `say` prints one plain line a shard."""

    say: Callable[[str], None]
    sentences: int = 0
    seconds: float = 0.0
    file_seconds: float = 0.0  # of the file being read (reset by translate_corpus)

    def shard_done(self, item: CorpusFile, shard: int, lines: int, seconds: float, position: int, size: int) -> None:
        self.sentences += lines
        self.seconds += seconds
        self.file_seconds += seconds
        rate = self.sentences / max(self.seconds, 1e-9)
        share = position / size if size else 1.0
        eta = ""
        if 0 < share < 1:
            left = int(self.file_seconds / share * (1 - share))
            eta = f", about {left // 3600}h {left % 3600 // 60:02d}m {left % 60:02d}s left of this file"
        self.say(f"{item.input}: shard {shard} ({lines} lines) in {seconds:.1f} s; {rate:.1f} sentences/s; "
                 f"{100 * share:.0f}% of the file read{eta}")


def translate_corpus(translator: Translator, files: list[CorpusFile], settings: dict, search: dict[str, Any], *,
                     shard_lines: int, process_index: int = 0, process_count: int = 1,
                     say: Callable[[str], None] = print) -> list[dict]:
    """Translate every file's shards that are this process's and not yet done; join each file whose shards are all
    written. `settings` (recorded; the same for a resumed job) describes the job; `search` holds the
    DecodeOptions fields to translate with (its seed is varied by shard for sampling). Returns the records of
    the outputs this process found finished."""
    check_outputs(files, settings)
    progress = Progress(say)
    settings_seed = search.get("seed") or 0
    records = []
    for file_index, item in enumerate(files):
        if finished(item, settings):
            say(f"{item.output}: already translated")
            records.append(_read_json(item.record))
            continue
        make_dirs(item.parts)
        if not exists(os.path.join(item.parts, SETTINGS)):
            write_atomically(os.path.join(item.parts, SETTINGS), json.dumps(settings, indent=2) + "\n")
        done = _done_shards(item)
        count, progress.file_seconds = 0, 0.0
        for shard, lines, position, size in _shards(item, shard_lines):
            count = shard + 1
            if shard % process_count != process_index or shard in done:
                continue
            start = time.perf_counter()
            truncated_before = translator.truncated
            if search.get("mode") == "sample":  # the draws of a shard fixed by its place, whoever translates it
                search = {**search, "seed": shard_seed(settings_seed, file_index, shard)}
            outputs = translator.translate(lines, **search)
            counts = {"lines": len(lines), "empty": sum(not line.strip() for line in lines),
                      "truncated": translator.truncated - truncated_before}
            base = os.path.join(item.parts, _shard_name(shard))
            write_atomically(base + ".json", json.dumps(counts) + "\n")
            write_atomically(base + ".txt", "".join(text + "\n" for text in outputs))  # the shard's record: last
            progress.shard_done(item, shard, len(lines), time.perf_counter() - start, position, size)
        if finished(item, settings):  # another process joined it meanwhile
            records.append(_read_json(item.record))
        elif _done_shards(item) >= set(range(count)):
            try:
                record = _join(item, count, settings)
            except OSError:  # another process joined it first and removed the shards under this one
                if not finished(item, settings):
                    raise
                record = _read_json(item.record)
            records.append(record)
            say(f"{item.output}: {record['lines']} lines ({record['empty']} empty, {record['truncated']} cut to the "
                f"model's max_len)")
        else:
            say(f"{item.input}: this process's shards are done; the other processes' are not all written yet (the "
                "last to finish writes the output)")
    return records
