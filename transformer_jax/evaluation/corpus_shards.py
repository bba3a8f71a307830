"""The shards of a corpus being translated (see corpus_translation.py): each kept whole in `<output>.parts/` with a
record of what it is, found intact or not, and the parts folder begun and removed.

A shard's record names the job (a digest of its settings and search), the file, the shard, its sampling seed, a digest
of the input lines it translated and one of its own text (`write_shard`); `intact_shard` keeps a shard only when its
record names all of these as the pass at hand finds them. The parts folder is made with the job's settings in one
step (`begin_parts`), and only what a job writes there is ever removed (`remove_parts`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Iterator

import numpy as np

from transformer_jax.base.files import (exists, is_dir, is_local, list_names, make_dirs, object_path, read_bytes,
                                        read_text, remove, unique_name, write_atomically)
from transformer_jax.data.sources import stream_lines
from transformer_jax.errors import ConfigError

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

    @property
    def name(self) -> str:
        """What the file is in its job (its shards' records and sampling seeds name it): the input's file name, the same
        whatever else a glob matches, in whatever order, and wherever the job is started from."""
        return os.path.basename(self.input.rstrip("/"))


def read_json(path: str) -> dict | None:
    try:
        value = json.loads(read_text(path)) if exists(path) else None
    except (ValueError, OSError):
        return None
    return value if isinstance(value, dict) else None


def bytes_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lines_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def input_digest(path: str) -> str:
    """sha256 of an input's lines as a pass reads them (each ended by "\\n"): what a record says was translated."""
    digest = hashlib.sha256()
    for _, line, _ in stream_lines(path):
        digest.update((line + "\n").encode("utf-8"))
    return digest.hexdigest()


def is_link(path: str) -> bool:
    """Whether a symbolic link is at `path` (dangling or not): no place this job writes holds one that it made."""
    return is_local(path) and os.path.islink(path)


def parts_settings(item: CorpusFile) -> dict | None:
    """The settings of the job that began `item`'s parts folder; None when there is none. Anything else at that
    place (a file, a link, a folder without a job's settings) is a ConfigError: it is not this command's, and
    nothing in it is read or removed."""
    if not (is_link(item.parts) or exists(item.parts)):
        return None
    settings = read_json(os.path.join(item.parts, SETTINGS)) if is_dir(item.parts) else None
    if settings is None or is_link(item.parts):
        raise ConfigError(f"{item.parts} exists but is not a translate-corpus parts folder (no {SETTINGS} of a job "
                          "in it); nothing in it is read or removed: move it away, or choose another --output_dir")
    return settings


def shard_seed(seed: int, name: str, shard: int) -> int:
    """The sampling seed of one shard: fixed by (seed, the input file's name, shard), whichever process translates
    it and wherever the file comes in the job's list.

    The name, not the place in the expanded list: a glob over a folder that gains files (new monolingual text
    arriving) moves the others in the list, and a seed of the place would join their kept shards with differently
    seeded new ones; pinning the list in the settings instead would refuse the resumed job, or redo every file."""
    name_number = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")
    return int(np.random.SeedSequence([seed, name_number, shard]).generate_state(1)[0] % 2**31)


def shard_path(item: CorpusFile, shard: int, suffix: str) -> str:
    return os.path.join(item.parts, f"{shard:09d}{suffix}")


def shard_identity(job: str, item: CorpusFile, shard: int, search: dict[str, Any]) -> dict[str, Any]:
    """What a shard's record names besides its input and text: the job, the file, the shard and its seed."""
    seed = shard_seed(search.get("seed") or 0, item.name, shard) if search.get("mode") == "sample" else None
    return {"job": job, "file": item.name, "shard": shard, "seed": seed}


def read_shards(item: CorpusFile, shard_lines: int) -> Iterator[tuple[int, list[str], int, int]]:
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


def intact_shard(item: CorpusFile, identity: dict[str, Any], input_digest: str) -> dict | None:
    """The record of a shard when its text is there, is what the record says, and translates the input lines of
    digest `input_digest` as this job's shard `identity`; else None (missing, damaged, of other input, or another
    job's or place's: to be translated again)."""
    record = read_json(shard_path(item, identity["shard"], ".json"))
    if record is None or record.get("input_sha256") != input_digest:
        return None
    if any(record.get(key) != value for key, value in identity.items()):
        return None
    try:
        text = read_bytes(shard_path(item, identity["shard"], ".txt"))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    if bytes_digest(text) != record.get("output_sha256") or text.count(b"\n") != record.get("lines"):
        return None
    return record


def begin_parts(item: CorpusFile, settings: dict) -> None:
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
    try:
        os.mkdir(staging)
        write_atomically(os.path.join(staging, SETTINGS), content)
        os.rename(staging, item.parts)  # fails when another process of the job made it first: theirs is kept
    except OSError as error:
        if not exists(os.path.join(item.parts, SETTINGS)):
            raise OSError(error.errno, error.strerror, item.parts) from error  # the folder, not its staging name
    finally:
        for name in os.listdir(staging) if os.path.isdir(staging) else []:
            os.remove(os.path.join(staging, name))
        if os.path.isdir(staging):
            os.rmdir(staging)


def write_shard(item: CorpusFile, identity: dict[str, Any], lines: list[str], outputs: list[str],
                 truncated: int) -> None:
    text = "".join(output + "\n" for output in outputs).encode("utf-8")
    record = {**identity, "lines": len(lines), "empty": sum(not line.strip() for line in lines),
              "truncated": truncated, "input_sha256": bytes_digest(lines_bytes(lines)), "output_sha256": bytes_digest(text)}
    write_atomically(shard_path(item, identity["shard"], ".json"), json.dumps(record) + "\n")
    write_atomically(shard_path(item, identity["shard"], ".txt"), text)


def remove_parts(item: CorpusFile) -> None:
    """Remove what this command wrote into `item`'s parts folder (its settings last: a cut removal leaves a resumable
    record), then the folder when nothing else is in it."""
    ours = [name for name in (list_names(item.parts) if is_dir(item.parts) else []) if WRITTEN_HERE.fullmatch(name)]
    for name in sorted(ours, key=lambda n: n == SETTINGS):
        with contextlib.suppress(FileNotFoundError):  # another process joining the same file removed it
            remove(os.path.join(item.parts, name))
    if is_local(item.parts):  # an object store has no folders to remove
        with contextlib.suppress(FileNotFoundError, OSError):  # removed by another process, or not ours left in it
            os.rmdir(item.parts)
