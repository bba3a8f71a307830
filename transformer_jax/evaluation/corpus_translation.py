"""Translating whole corpora (millions of lines) resumably, over every process of a job.

Each input file is read once a pass, a line at a time, in shards of `shard_lines` lines; shard k of a file goes to
process k mod (processes), which translates it with its own devices (`Translator`: sorted by length, token-budget
batches) and writes it whole into `<output>.parts/` (write-then-rename; corpus_shards.py): its text, and beside it a
record of what it is: the job (a digest of its settings, which name the model, and of its search), the file, the
shard, its sampling seed, a digest of the input lines it translated and one of its own text. A job stopped anywhere
(SIGTERM, SIGKILL, a preempted VM) and started again with the same command keeps every shard whose record names all
of these as this pass finds them, and translates the others again: an input edited between attempts, another file of
the same name, a shard copied from another job or another place, a damaged or missing shard file are redone, never
joined.

The process that finds every shard of a file intact reads the input once more: when it no longer holds the lines the
shards translate (edited while the job ran), nothing is joined and the job stops in one line (the same command then
redoes the shards whose lines changed). Else it writes `<output>.json` (the settings, counts, the digest of the
input lines translated and that of the output), then `<output>` from its shards (written whole; each shard checked
against its digest on the way), and removes the parts it wrote; the result is the same bytes as an uninterrupted
job's over the input as it is at the end. A fault of a place (a directory where a file goes, no permission, an
immutable or read-only folder) is one line naming it and the fix (`faults_of`); what was written stays.

Nothing at `<output>` (or `.json`, `.parts`) is replaced unless this job made it: a file there is this job's only when
a record of this job's settings names its digest, and a link, a folder or anything else there is refused in one line,
before any work and again before the join. The parts folder is made with its settings in one step, when the first
shard is written: a first attempt that fails before that leaves nothing behind; a folder at `<output>.parts` that
holds no such settings is someone else's, and nothing in it is read or removed. A finished output whose input or
text changed since it was written is refused, not answered "already translated".

Sampling draws from a seed derived from (--seed, the input file's name, the shard), each line from that seed folded
with its place in the shard: the same shards give the same samples whichever process, attempt or position in a glob
translates them, on however many devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator

from transformer_jax.base.files import (exists, is_file, is_local, object_path, read_bytes, write_atomically,
                                        write_streamed)
from transformer_jax.data.sources import check_text_file
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.errors import ConfigError, DataError
from transformer_jax.evaluation.corpus_shards import (CorpusFile, begin_parts, bytes_digest, input_digest, intact_shard,
                                                      is_link, lines_bytes, parts_settings, read_json, read_shards,
                                                      remove_parts, shard_identity, shard_path, write_shard)
from transformer_jax.evaluation.outputs import check_output_dir, check_writable, faults_named, file_identity, resolved
from transformer_jax.evaluation.translator import Translator

LOCK = ".lock"  # <output>.lock: the job that owns the output (base.lock.Claim)
KEPT = "run the same command again (the shards finished so far are kept in each output's .parts folder)"


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

    Each input must be a file that can be read more than once (it is, to check what was translated), named once (one
    file under two names is refused); an `output_dir` that cannot be a directory, a suffix that is not a plain name,
    two inputs for one output or an output at an input's place are refused."""
    if not suffix or suffix != suffix.strip() or "/" in suffix or suffix in (".", ".."):
        raise ConfigError(f"--suffix={suffix!r} must be a plain name (the outputs are <input name>.<suffix>), "
                          "without a / or surrounding spaces; choose a name such as de")
    if output_dir is not None:
        check_output_dir(output_dir, "--output_dir")
    named: dict[Any, str] = {}
    for path in inputs:
        if is_local(path):
            check_text_file(path)
        elif not is_file(path):
            raise DataError(f"{path} does not exist or is not a file; check the path")
        first = named.setdefault(file_identity(path), path)
        if first != path:
            raise ConfigError(f"{first} and {path} are one file, named twice in this job; name it once")
    planned = [CorpusFile(path, path + f".{suffix}" if output_dir is None else
                          os.path.join(output_dir, os.path.basename(path.rstrip("/")) + f".{suffix}"))
               for path in inputs]
    writers: dict[str, CorpusFile] = {}
    for item in planned:
        if writers.setdefault(resolved(item.output), item) is not item:
            raise ConfigError(f"two inputs would write {item.output} (the same file name in --output_dir); "
                              "translate them in two jobs, or leave --output_dir out to write beside each input")
    places = {resolved(path) for path in inputs} | {os.path.realpath(path) for path in inputs if is_local(path)}
    for item in planned:
        for path in (item.output, item.record, item.parts, item.output + LOCK):
            if resolved(path) in places:
                raise ConfigError(f"the output {path} of {item.input} is an input too; choose another --output_dir")
    return planned


@contextlib.contextmanager
def faults_of(files: list[CorpusFile]) -> Iterator[None]:
    """A fault of the place of a job's input or output (or of what it writes beside them) as one line saying what to
    do and that nothing is lost (outputs.faults_named); each output's folder is first made if missing and made to
    take a file (outputs.check_writable), so that every process of a job finds a folder that takes none."""
    with faults_named([path for item in files for path in (item.input, item.output)], KEPT):
        check_writable(os.path.dirname(item.output) for item in files)
        yield


def _file_digest(path: str) -> str:
    """sha256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with (open(path, "rb") if is_local(path) else object_path(path).open("rb")) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def finished(item: CorpusFile, settings: dict) -> bool:
    """Whether `item`'s output is there, a regular file, with a record of the same settings (check_outputs has
    checked, before any work, that the record names its digest)."""
    record = read_json(item.record)
    regular = is_file(item.output) and not is_link(item.output)
    return regular and record is not None and record.get("settings") == settings


def _changed(old: dict, new: dict) -> str:
    return ", ".join(sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key)))


def _check_finished(item: CorpusFile, record: dict) -> None:
    """A finished output still is its input's translation, whole: else a ConfigError naming what changed."""
    if record.get("output_sha256") != _file_digest(item.output):
        raise ConfigError(f"{item.output} is not the text its .json records (edited, cut or put there since it was "
                          "written); nothing is overwritten: remove it and its .json to translate the input again")
    if record.get("input_sha256") != input_digest(item.input):
        raise ConfigError(f"{item.input} changed since {item.output} was translated from it; nothing is "
                          f"overwritten: remove {item.output} and its .json to translate it again, or choose another "
                          "--output_dir")


def check_outputs(files: list[CorpusFile], settings: dict) -> None:
    """Each output is absent, finished by this job (its input and text unchanged since), or begun by it (same
    settings); anything else at `<output>` or `<output>.json` (a file, a link, a folder this job did not make) is a
    ConfigError naming it, parts folder or not. Before any work, and again before a join."""
    for item in files:
        begun = parts_settings(item)
        if begun is not None and begun != settings:
            raise ConfigError(f"{item.parts} holds a translation begun with other settings "
                              f"({_changed(begun, settings)}); run the same command as before to finish it, or remove "
                              "that folder to start anew")
        for path in (item.output, item.record):
            if is_link(path):
                raise ConfigError(f"{path} is a symbolic link (to {os.readlink(path)}), where this job writes; "
                                  "nothing is replaced that the job did not make: move it away, or choose another "
                                  "--output_dir")
        record = read_json(item.record)
        ours = record is not None and record.get("settings") == settings
        if exists(item.output) and not is_file(item.output):
            raise ConfigError(f"{item.output} is a directory (or not a regular file), where this job writes its "
                              "output; nothing is replaced that the job did not make: move it away, or choose "
                              "another --output_dir")
        if exists(item.output) and ours:
            _check_finished(item, record)
        elif exists(item.output) and record is not None and isinstance(record.get("settings"), dict):
            raise ConfigError(f"{item.output} was translated with other settings "
                              f"({_changed(record['settings'], settings)}); nothing is overwritten: remove it and its "
                              ".json, or choose another --output_dir")
        elif exists(item.output) or (exists(item.record) and not ours):
            raise ConfigError(f"{item.output if exists(item.output) else item.record} exists and is not this job's "
                              "output; nothing is overwritten: move it away, or choose another --output_dir")


def _join(item: CorpusFile, records: list[dict], settings: dict, input_digest: str) -> dict:
    """Write `<output>.json`, then `<output>` from its shards (each checked against its record on the way); remove
    the parts this command wrote. Returns the record. The record comes first: a file at `<output>` is this job's only
    when this job's record names its digest, so a join cut between the two is done again, never taken for the user's
    file (nor the user's file for it)."""
    totals = {key: sum(record[key] for record in records) for key in ("lines", "empty", "truncated")}

    def texts() -> Iterator[bytes]:
        for shard, record in enumerate(records):
            text = read_bytes(shard_path(item, shard, ".txt"))
            if bytes_digest(text) != record["output_sha256"]:  # changed since it was checked: join nothing
                raise DataError(f"{shard_path(item, shard, '.txt')} changed while {item.output} was being joined; "
                                "run the same command again (it translates that shard again)")
            yield text

    output_digest = hashlib.sha256()
    for text in texts():
        output_digest.update(text)
    record = {"input": item.input, "file": item.name, "settings": settings, **totals, "input_sha256": input_digest,
              "output_sha256": output_digest.hexdigest()}
    write_atomically(item.record, json.dumps(record, indent=2) + "\n")
    write_streamed(item.output, texts())
    remove_parts(item)
    return record


@dataclasses.dataclass
class Progress:
    """Sentences translated by this process and the time they took; `say` prints one plain line a shard."""

    say: Callable[[str], None]
    sentences: int = 0
    seconds: float = 0.0
    file_seconds: float = 0.0  # of the file being read (reset for each file)

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


@dataclasses.dataclass(frozen=True)
class Job:
    """What a process translates with: the recorded settings, the search (DecodeOptions fields), the shards' size
    and this process's share of them."""

    settings: dict
    search: dict[str, Any]
    shard_lines: int
    process_index: int = 0
    process_count: int = 1

    @property
    def digest(self) -> str:
        """Names the job in each shard's record: its settings (the model's fingerprint among them) and its search."""
        named = json.dumps({"settings": self.settings, "search": self.search}, sort_keys=True, default=str)
        return bytes_digest(named.encode("utf-8"))[:16]


def _translate_file(translator: Translator, item: CorpusFile, job: Job, progress: Progress) -> dict | None:
    """Translate this process's shards of `item` that are not intact; join them when all are. Returns the output's
    record when it is finished."""
    if finished(item, job.settings):
        remove_parts(item)  # what a join cut after its output left
        progress.say(f"{item.output}: already translated")
        return read_json(item.record)
    identities, digests, read = [], [], hashlib.sha256()  # of every shard as this pass reads the input
    progress.file_seconds, job_digest = 0.0, job.digest
    for shard, lines, position, size in read_shards(item, job.shard_lines):
        text = lines_bytes(lines)
        read.update(text)
        identities.append(shard_identity(job_digest, item, shard, job.search))
        digests.append(bytes_digest(text))
        if shard % job.process_count != job.process_index or intact_shard(item, identities[-1], digests[-1]):
            continue
        start = time.perf_counter()
        truncated_before = translator.truncated
        search = job.search if identities[-1]["seed"] is None else {**job.search, "seed": identities[-1]["seed"]}
        outputs = translator.translate(lines, **DecodeOptions(**search).settings())  # its mode's alone
        begin_parts(item, job.settings)
        write_shard(item, identities[-1], lines, outputs, translator.truncated - truncated_before)
        progress.shard_done(item, shard, len(lines), time.perf_counter() - start, position, size)
    intact = [intact_shard(item, identity, digest) for identity, digest in zip(identities, digests)]
    if finished(item, job.settings):  # another process joined it meanwhile
        return read_json(item.record)
    if not all(record is not None for record in intact):
        progress.say(f"{item.input}: this process's shards are done; the other processes' are not all written yet "
                     "(the last to finish writes the output)")
        return None
    if input_digest(item.input) != read.hexdigest():
        raise DataError(f"{item.input} changed while it was being translated, so {item.output} is not written; "
                        f"{KEPT}: it translates again the shards whose lines changed")
    check_outputs([item], job.settings)  # nothing of the user's came to <output> while the job ran
    try:
        record = _join(item, intact, job.settings, read.hexdigest())
    except OSError:  # another process joined it first and removed the shards under this one
        if not finished(item, job.settings):
            raise
        record = read_json(item.record)
    progress.say(f"{item.output}: {record['lines']} lines ({record['empty']} empty, {record['truncated']} cut to the "
                 "model's max_len)")
    return record


def translate_corpus(translator: Translator, files: list[CorpusFile], settings: dict, search: dict[str, Any], *,
                     shard_lines: int, process_index: int = 0, process_count: int = 1,
                     say: Callable[[str], None] = print) -> list[dict]:
    """Translate every file's shards that are this process's and not yet intact; join each file whose shards are
    all intact. `settings` (recorded; the same for a resumed job) describes the job; `search` holds the
    DecodeOptions fields to translate with (its seed is varied by shard for sampling). Returns the records of
    the outputs this process found finished. A fault of a file's place is one StorageError line (faults_named)."""
    job = Job(settings, search, shard_lines, process_index, process_count)
    progress = Progress(say)
    with faults_of(files):
        check_outputs(files, settings)
        records = [_translate_file(translator, item, job, progress) for item in files]
    return [record for record in records if record is not None]
