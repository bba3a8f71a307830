"""Translating whole corpora (millions of lines) resumably, over every process of a job.

Each input file is read a line at a time, in shards of `shard_lines` lines; shard k of a file goes to process
k mod (processes), which translates it with its own devices (`Translator`: sorted by length, token-budget
batches) and writes it whole into `<output>.parts/` (write-then-rename): its translations, and beside them a
record of its counts, of a digest of the input lines it translated and of a digest of its own text. A job stopped
anywhere (SIGTERM, SIGKILL, a preempted VM) and started again with the same command keeps every shard whose record
matches both its input lines as they are now and its text, and translates the others again: an input edited
between attempts, another file of the same name, a damaged or missing shard file are redone, never joined. The
process that finds every shard of a file intact joins them into `<output>` (written whole; each shard checked
against its digest on the way), records the settings, counts and digests of input and output in `<output>.json`
and removes the parts it wrote; the result is the same bytes as an uninterrupted job's.

The settings a job records name the model (its tokenizer and parameters, `Translator.fingerprint`), so a
checkpoint replaced between attempts is refused, not joined to the old one's shards. The parts folder is made
with its settings in one step, when the first shard is written: a first attempt that fails before that leaves
nothing behind. A folder at `<output>.parts` that holds no such settings is someone else's: it is refused, and
nothing in it is read or removed.

Sampling draws from a seed derived from (--seed, the file's place, the shard), each line from that seed folded with
its place in the shard: the same shards give the same samples whichever process, or which attempt, translates
them, on however many devices. Nothing is overwritten: an output that exists and is not this job's (no matching
`.json` or `.parts/` settings), or whose input or text changed since it was written, stops the job before any work.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import time
from typing import Any, Callable, Iterator

import numpy as np

from transformer_jax.base.files import (exists, is_dir, is_file, is_local, list_names, make_dirs, object_path,
                                        read_bytes, read_text, remove, unique_name, write_atomically, write_streamed)
from transformer_jax.data.sources import check_text_file, stream_lines
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import ConfigError, DataError
from transformer_jax.evaluation.translator import Translator

PARTS = ".parts"  # <output>.parts/: the shards written so far, and the job's settings
SETTINGS = "settings.json"
RECORD = ".json"  # <output>.json: the settings, counts and digests of a finished output
# The names a job writes into a parts folder (its temporaries included): the only ones a join removes.
WRITTEN_HERE = re.compile(r"(settings\.json|\d{9}\.(txt|json))(\.tmp\..+)?")


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
                matched = sorted(str(path) for path in object_path(f"{root}://{bucket}").glob(glob_part))
            if not matched:
                raise DataError(f"--input {pattern} matches no file; check the pattern")
            files += matched
        else:
            files.append(pattern)
    return list(dict.fromkeys(files))


def plan_files(inputs: list[str], output_dir: str | None, suffix: str) -> list[CorpusFile]:
    """Each input with its output: `<input>.<suffix>` beside it, or `<output_dir>/<input's name>.<suffix>`.

    Each input must be a file that can be read more than once (it is, to check what was translated); an
    `output_dir` that is a file, or a suffix that is not a plain name, is refused."""
    if not suffix or "/" in suffix or suffix in (".", ".."):
        raise ConfigError(f"--suffix={suffix!r} must be a plain name (the outputs are <input name>.<suffix>), "
                          "without a /; choose a name such as de")
    if output_dir is not None and exists(output_dir) and not is_dir(output_dir):
        raise ConfigError(f"--output_dir {output_dir} is a file; pass a directory (it is created if missing)")
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
    for path in inputs:
        if is_local(path):
            check_text_file(path)
        elif not is_file(path):
            raise DataError(f"{path} does not exist or is not a file; check the path")
    return planned


def _read_json(path: str) -> dict | None:
    try:
        value = json.loads(read_text(path)) if exists(path) else None
    except (ValueError, OSError):
        return None
    return value if isinstance(value, dict) else None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: str) -> str:
    """sha256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with (open(path, "rb") if is_local(path) else object_path(path).open("rb")) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _lines_digest(lines: list[str]) -> str:
    return _digest("".join(line + "\n" for line in lines).encode("utf-8"))


def finished(item: CorpusFile, settings: dict) -> bool:
    """Whether `item`'s output is this job's: it exists with a record of the same settings."""
    record = _read_json(item.record)
    return exists(item.output) and record is not None and record.get("settings") == settings


def _changed(old: dict, new: dict) -> str:
    return ", ".join(sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key)))


def _check_finished(item: CorpusFile) -> None:
    """A finished output still is its input's translation, whole: else a ConfigError naming what changed."""
    record = _read_json(item.record) or {}
    if record.get("input_sha256") != _file_digest(item.input):
        raise ConfigError(f"{item.input} changed since {item.output} was translated from it; nothing is "
                          f"overwritten: remove {item.output} and its .json to translate it again, or choose another "
                          "--output_dir")
    if record.get("output_sha256") != _file_digest(item.output):
        raise ConfigError(f"{item.output} is not the text its .json records (edited or cut since it was written); "
                          "remove it and its .json to translate the input again")


def parts_settings(item: CorpusFile) -> dict | None:
    """The settings of the job that began `item`'s parts folder; None when there is none. Anything else at that
    place (a file, a folder without a job's settings) is a ConfigError: it is not this command's, and nothing in it
    is read or removed."""
    if not exists(item.parts):
        return None
    settings = _read_json(os.path.join(item.parts, SETTINGS)) if is_dir(item.parts) else None
    if settings is None:
        raise ConfigError(f"{item.parts} exists but is not a translate-corpus parts folder (no {SETTINGS} of a job "
                          "in it); nothing in it is read or removed: move it away, or choose another --output_dir")
    return settings


def check_outputs(files: list[CorpusFile], settings: dict) -> None:
    """Before any work: each output is absent, finished by this job (its input and text unchanged since), or begun
    by it (same settings); anything else is a ConfigError naming it."""
    for item in files:
        if finished(item, settings):
            _check_finished(item)
            continue
        begun = parts_settings(item)
        if begun is not None and begun != settings:
            raise ConfigError(f"{item.parts} holds a translation begun with other settings "
                              f"({_changed(begun, settings)}); run the same command as before to finish it, or remove "
                              "that folder to start anew")
        record = _read_json(item.record)
        if begun is None and record is not None and exists(item.output) and isinstance(record.get("settings"), dict):
            raise ConfigError(f"{item.output} was translated with other settings "
                              f"({_changed(record['settings'], settings)}); nothing is overwritten: remove it and its "
                              ".json, or choose another --output_dir")
        if begun is None and (exists(item.output) or exists(item.record)):
            raise ConfigError(f"{item.output} exists and is not this job's output; nothing is overwritten: remove "
                              "it, or choose another --output_dir")


def shard_seed(seed: int, file_index: int, shard: int) -> int:
    """The sampling seed of one shard: fixed by (seed, file, shard), whichever process translates it."""
    return int(np.random.SeedSequence([seed, file_index, shard]).generate_state(1)[0] % 2**31)


def _shard_path(item: CorpusFile, shard: int, suffix: str) -> str:
    return os.path.join(item.parts, f"{shard:09d}{suffix}")


def _shards(item: CorpusFile, shard_lines: int) -> Iterator[tuple[int, list[str], int, int]]:
    """(shard number, its lines, bytes read so far, the file's size) of `item`'s input, read a line at a time."""
    size = os.path.getsize(item.input) if is_local(item.input) else object_path(item.input).stat().length
    lines: list[str] = []
    shard, position = 0, 0
    for _, line, position in stream_lines(item.input):
        lines.append(line)
        if len(lines) == shard_lines:
            yield shard, lines, position, size
            shard, lines = shard + 1, []
    if lines:
        yield shard, lines, position, size


def _intact_shard(item: CorpusFile, shard: int, input_digest: str) -> dict | None:
    """The record of `shard` when its text is there, is what the record says, and translates the input lines of
    digest `input_digest`; else None (missing, damaged, or of other input: to be translated again)."""
    record = _read_json(_shard_path(item, shard, ".json"))
    if record is None or record.get("input_sha256") != input_digest:
        return None
    try:
        text = read_bytes(_shard_path(item, shard, ".txt"))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    if _digest(text) != record.get("output_sha256") or text.count(b"\n") != record.get("lines"):
        return None
    return record


def _begin_parts(item: CorpusFile, settings: dict) -> None:
    """Make `item`'s parts folder with the job's settings in it, in one step (unless it is there, with them)."""
    content = json.dumps(settings, indent=2) + "\n"
    if not is_local(item.parts):  # an object store has no folders: the settings object makes the "folder"
        if not exists(os.path.join(item.parts, SETTINGS)):
            write_atomically(os.path.join(item.parts, SETTINGS), content)
        return
    if exists(item.parts):
        return
    make_dirs(os.path.dirname(os.path.abspath(item.parts)))
    staging = unique_name(f"{item.parts}.new")
    os.mkdir(staging)
    try:
        write_atomically(os.path.join(staging, SETTINGS), content)
        os.rename(staging, item.parts)  # fails when another process of the job made it first: theirs is kept
    except OSError:
        if not exists(os.path.join(item.parts, SETTINGS)):
            raise
    finally:
        for name in os.listdir(staging) if os.path.isdir(staging) else []:
            os.remove(os.path.join(staging, name))
        if os.path.isdir(staging):
            os.rmdir(staging)


def _write_shard(item: CorpusFile, shard: int, lines: list[str], outputs: list[str], truncated: int) -> None:
    text = "".join(output + "\n" for output in outputs).encode("utf-8")
    record = {"lines": len(lines), "empty": sum(not line.strip() for line in lines), "truncated": truncated,
              "input_sha256": _lines_digest(lines), "output_sha256": _digest(text)}
    write_atomically(_shard_path(item, shard, ".json"), json.dumps(record) + "\n")
    write_atomically(_shard_path(item, shard, ".txt"), text)


def _join(item: CorpusFile, records: list[dict], settings: dict) -> dict:
    """Write `<output>` from its shards (each checked against its record on the way), then its record; remove
    the parts this command wrote. Returns the record."""
    totals = {key: sum(record[key] for record in records) for key in ("lines", "empty", "truncated")}
    output_digest = hashlib.sha256()

    def chunks() -> Iterator[bytes]:
        for shard, record in enumerate(records):
            text = read_bytes(_shard_path(item, shard, ".txt"))
            if _digest(text) != record["output_sha256"]:  # changed since it was checked: join nothing
                raise DataError(f"{_shard_path(item, shard, '.txt')} changed while {item.output} was being joined; "
                                "run the same command again (it translates that shard again)")
            output_digest.update(text)
            yield text

    write_streamed(item.output, chunks())
    record = {"input": item.input, "settings": settings, **totals, "input_sha256": _file_digest(item.input),
              "output_sha256": output_digest.hexdigest()}
    write_atomically(item.record, json.dumps(record, indent=2) + "\n")
    ours = [name for name in (list_names(item.parts) if is_dir(item.parts) else []) if WRITTEN_HERE.fullmatch(name)]
    for name in sorted(ours, key=lambda n: n == SETTINGS):
        try:
            remove(os.path.join(item.parts, name))  # the settings last: a cut removal leaves a resumable record
        except FileNotFoundError:
            pass  # another process joining the same file removed it
    if is_local(item.parts):  # an object store has no folders to remove
        try:
            os.rmdir(item.parts)
        except OSError:
            pass  # another process joining the same file removed it, or something not ours is left in it
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
    """Translate every file's shards that are this process's and not yet intact; join each file whose shards are
    all intact. `settings` (recorded; the same for a resumed job) describes the job; `search` holds the
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
        digests: list[str] = []  # of every shard's input lines, as the input is now
        progress.file_seconds = 0.0
        for shard, lines, position, size in _shards(item, shard_lines):
            digests.append(_lines_digest(lines))
            if shard % process_count != process_index or _intact_shard(item, shard, digests[-1]):
                continue
            start = time.perf_counter()
            truncated_before = translator.truncated
            if search.get("mode") == "sample":  # the draws of a shard fixed by its place, whoever translates it
                search = {**search, "seed": shard_seed(settings_seed, file_index, shard)}
            outputs = translator.translate(lines, **DecodeOptions(**search).settings())  # its mode's alone
            _begin_parts(item, settings)
            _write_shard(item, shard, lines, outputs, translator.truncated - truncated_before)
            progress.shard_done(item, shard, len(lines), time.perf_counter() - start, position, size)
        intact = [_intact_shard(item, shard, digest) for shard, digest in enumerate(digests)]
        if finished(item, settings):  # another process joined it meanwhile
            records.append(_read_json(item.record))
        elif all(record is not None for record in intact):
            try:
                record = _join(item, intact, settings)
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
