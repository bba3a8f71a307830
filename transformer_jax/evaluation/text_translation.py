"""Translating text with a model's parameters: encoded sentences (`translate_encoded`, what every path to a
translation runs), lines, files and standard input (in blocks of what has arrived).

Given a device mesh, each device decodes its own rows of every batch (`translate_rows`: parameters replicated,
no communication inside the search) and the outputs are gathered; the translations are those of one device.
A mesh may span several processes (a TPU pod, `--multihost`): every process makes the same batches, places
them as one global array (each device copying its own rows, `place_rows`), and gathers every batch's outputs
(`process_allgather`), so all processes hold the same translations.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from transformer_jax.base.console import plain_lines
from transformer_jax.base.sharding import mesh_platform, place_rows
from transformer_jax.checkpoints.saved_run import Run
from transformer_jax.data.batching import restore_order
from transformer_jax.data.encoded import EncodedPairs, encode_pairs
from transformer_jax.data.shapes import TranslationBatching, round_rows
from transformer_jax.data.sources import stream_lines
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.translation_batches import translation_batches
from transformer_jax.decoding.options import DecodeOptions
from transformer_jax.decoding.translate import decoding_precision, translate_batch, translate_rows
from transformer_jax.errors import ConfigError, DataError
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.special_tokens import EOS_ID, PAD_ID


# How long a block of standard input waits for more lines after its first (`standard_input_blocks`).
STDIN_WAIT_S = 0.1


@functools.partial(jax.jit, static_argnames=("config", "options"))
def _translate(params: Any, src_tokens: jax.Array, rng: jax.Array, config: TransformerConfig,
               options: DecodeOptions, row_ids: jax.Array) -> jax.Array:
    return translate_batch(params, config, src_tokens, options, rng, row_ids)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """`tree` whole on every device of `mesh` (e.g. fsdp-sharded parameters gathered once)."""
    replicated = NamedSharding(mesh, PartitionSpec())
    if jax.process_count() == 1:
        return jax.device_put(tree, replicated)
    if all(getattr(leaf, "sharding", None) == replicated for leaf in jax.tree.leaves(tree)):
        return tree
    # One program for the whole tree: device_put reshards leaf by leaf, one program each, and with
    # several CPU processes (gloo) a run of those was seen to hang.
    return jax.jit(lambda t: t, out_shardings=replicated)(tree)


def _dispatch_batch(params: Any, src_BxS: np.ndarray, rng: jax.Array, config: TransformerConfig,
                    options: DecodeOptions, mesh: Mesh | None, row_ids_B: np.ndarray) -> jax.Array:
    """Start decoding one batch ([B, L] output ids, not waited for): split over `mesh` by rows, or on one device;
    a sampled row draws from `rng` folded with its id (`row_ids_B`)."""
    if mesh is None:
        return _translate(params, src_BxS, rng, config, options, row_ids_B)
    src_BxS, row_ids_B = place_rows((src_BxS, row_ids_B), mesh)
    return translate_rows(params, src_BxS, rng, config, options, mesh, row_ids_B)


def _fetch_ids(ids_BxL: jax.Array) -> np.ndarray:
    """A dispatched batch's [B, L] output ids on this host (gathered from every process)."""
    if ids_BxL.is_fully_addressable:
        return np.asarray(ids_BxL)
    return np.asarray(multihost_utils.process_allgather(ids_BxL, tiled=True))


def fit_to_model(src_BxS: np.ndarray, max_len: int, real_B: np.ndarray | None = None) -> np.ndarray:
    """Cut source rows longer than the model's max_len (keeping their EOS), with a warning counting the real
    rows (`real_B`: which rows are sentences, not a batch's padding rows)."""
    if src_BxS.shape[1] <= max_len:
        return src_BxS
    lengths = (src_BxS != PAD_ID).sum(1)
    long_B = (lengths > max_len) & (True if real_B is None else real_B)
    if long_B.any():
        logging.warning(
            "%d source sentence(s) longer than model.max_len=%d tokens are truncated for decoding",
            int(long_B.sum()), max_len,
        )
    cut = src_BxS[:, :max_len].copy()
    cut[lengths > max_len, max_len - 1] = EOS_ID
    return cut


def translate_encoded(
    params: Any, config: TransformerConfig, encoded: EncodedPairs, tokenizer: Tokenizer,
    options: DecodeOptions = DecodeOptions(), *, batching: TranslationBatching = TranslationBatching(),
    dtype: str = "", show_progress: bool = True, mesh: Mesh | None = None, first_row_id: int = 0,
    interrupt: Callable[[], None] | None = None,
) -> list[str]:
    """Detokenized translations of every source sentence, in corpus order; empty sources give ''.

    Each translation is one line: a newline the tokenizer's byte pieces produce becomes a space.
    With `mesh`, every batch's rows (padded to a multiple of the mesh size) are split over its devices
    and the translations gathered to every process. Sampling draws each sentence from the seed folded with
    its row id, `first_row_id` + its place in `encoded` (a block's first line in its stream), so the samples
    are the same in any batching, on any number of devices.
    The search runs in `dtype` ("" the model's own), its precision chosen once for the devices' platform.
    `interrupt`, called before each batch, abandons the translation by raising (a training run's stop).
    """
    if mesh is not None:
        # Without logical-axis boxes nothing inside the shard_map asks for a sharding.
        params = replicate(nn.meta.unbox(params), mesh)
    # A source that is only EOS was an empty line: its translation is empty, keeping lines aligned.
    empty = encoded.source.lengths <= 1
    batches = translation_batches(encoded, batching.batch_size, batching.batch_tokens, items=np.flatnonzero(~empty),
                                  row_multiple=1 if mesh is None else mesh.size)
    logging.info("translating %d sentences in %d batches on %d device(s)", int((~empty).sum()), len(batches),
                 1 if mesh is None else mesh.size)
    # The weights in the decoding dtype once, not inside every batch's search.
    platform = jax.default_backend() if mesh is None else mesh_platform(mesh)
    params, config = decoding_precision(params, config, dtype, platform)
    # The seed is in `rng`: the compiled search (options are static) is the same for every seed, so that a bulk
    # job's shards, each with its own seed, reuse one program instead of compiling their own. Every batch gets
    # the same key: a sentence's draws come from it folded with the sentence's place (its row id).
    rng = jax.random.key(options.seed)
    options = dataclasses.replace(options, seed=0)
    outputs: list[str] = []
    indices: list[int] = []
    pending: tuple[jax.Array, np.ndarray] | None = None
    shown = show_progress and jax.process_index() == 0  # one bar for a multi-process run, not one per host
    # No carriage-return bar into a log file (see run/progress.py's plain lines).
    with tqdm(total=len(encoded), unit="sent", desc="translate", disable=not shown or plain_lines()) as progress:
        progress.update(int(empty.sum()))
        # One batch in flight: the next is dispatched before the last one's ids are fetched and detokenized.
        for batch in [*batches, None]:
            started = None
            if batch is not None:
                if interrupt is not None:
                    interrupt()
                src = fit_to_model(batch["inputs"], config.max_len, batch["index"] >= 0)
                row_ids = (first_row_id + np.maximum(batch["index"], 0)).astype(np.uint32)  # padding rows: -1
                started = (_dispatch_batch(params, src, rng, config, options, mesh, row_ids), batch["index"])
            if pending is not None:
                ids, index = _fetch_ids(pending[0]), pending[1]
                outputs.extend(" ".join(text.splitlines()) for text in tokenizer.decode_batch(ids[index >= 0]))
                indices.extend(index[index >= 0].tolist())
                progress.update(int((index >= 0).sum()))
            pending = started
    for position in np.flatnonzero(empty):
        outputs.append("")
        indices.append(int(position))
    return restore_order(outputs, indices, len(encoded))


def translate_lines(run: Run, params: Any, lines: Iterable[str], options: DecodeOptions, *,
                    batching: TranslationBatching = TranslationBatching(), dtype: str = "",
                    mesh: Mesh | None = None) -> Iterator[str]:
    """Translations of `lines`, yielded in order; `batching.batch_size` lines are decoded together
    (their rows split over `mesh` when given)."""
    yield from translate_blocks(run, params, blocks_of(lines, batching.batch_size), options, batching=batching,
                                dtype=dtype, mesh=mesh)


def blocks_of(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """`lines` (each without its line break) in lists of `size`, the last one shorter."""
    block: list[str] = []
    for line in lines:
        block.append(line.rstrip("\n") if isinstance(line, str) else line)  # not text: refused by check_texts
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def translate_blocks(run: Run, params: Any, blocks: Iterable[list[str]], options: DecodeOptions, *,
                     batching: TranslationBatching = TranslationBatching(), dtype: str = "",
                     mesh: Mesh | None = None) -> Iterator[str]:
    """Translations of each block of lines, yielded in order as each block is done; a block is sorted by length
    into token-budget batches (`batching`) whose rows are split over `mesh` when given."""
    if mesh is not None:
        params = replicate(nn.meta.unbox(params), mesh)  # once, not for every block
    first_line = 0  # sampling's row ids count lines across blocks: the draws do not depend on where blocks end
    for block in blocks:
        yield from _translate_chunk(run, params, block, options, batching, dtype, mesh, first_line)
        first_line += len(block)


def check_input(path: str, named: str = "input ", processes: int = 1) -> None:
    """Refuse a text input that cannot be read: a directory, a missing or unreadable file (permission denied),
    standard input ("-") that is closed or read by `processes` > 1. `named` starts each message (the translate
    command: "--input=")."""
    if path == "-" and processes > 1:
        raise ConfigError(f"{named}- reads standard input, which one process alone has; pass a file that every "
                          "process can read, or translate in one process (without --multihost)")
    if path == "-" and sys.stdin is None:  # started with standard input closed (`<&-`)
        raise DataError(f"{named}- reads standard input, but it is closed; pipe the text in or pass a file")
    if path != "-" and os.path.isdir(path):
        raise DataError(f"{named}{path} is a directory; pass a text file or - (standard input)")
    if path != "-" and not os.path.exists(path):
        raise DataError(f"{named}{path} does not exist; pass a text file or - (standard input)")
    if path != "-" and os.path.isfile(path):  # opened once now (a pipe is not: its writer would see it closed)
        try:
            open(path, "rb").close()
        except OSError as error:
            raise DataError(f"{named}{path} cannot be read ({error.strerror or error}); make it readable "
                            "(chmod u+r) or pass another file") from None


def translate_file(run: Run, params: Any, path: str, options: DecodeOptions, *,
                   batching: TranslationBatching = TranslationBatching(), dtype: str = "",
                   mesh: Mesh | None = None) -> Iterator[str]:
    """Translations of each line of the UTF-8 text file `path` ("-": standard input, a line at a time,
    on one device, in a single-process run), batches split over `mesh` when given."""
    check_input(path, processes=jax.process_count())
    if path == "-":  # blocks of what has arrived: a pipe fills them, a line typed alone is answered alone
        yield from translate_blocks(run, params, standard_input_blocks(batching.batch_size), options,
                                    batching=batching, dtype=dtype, mesh=mesh)
        return
    # Read a line at a time (a pipe, `<(command)`, too): memory does not grow with the file.
    lines = (line for _, line, _ in stream_lines(path, strip=True))
    yield from translate_lines(run, params, lines, options, batching=batching, dtype=dtype, mesh=mesh)


def standard_input_blocks(size: int, wait_s: float = STDIN_WAIT_S) -> Iterator[list[str]]:
    """Standard input's lines in blocks of at most `size`: a block is what has arrived by `wait_s` after its first
    line (or `size` lines, sooner), so a pipe gives full blocks and a line typed alone is a block of one."""
    arrived: queue.Queue = queue.Queue(maxsize=4 * size)  # the reader stays a few blocks ahead, no further

    def read() -> None:
        try:
            for line in standard_input_lines():
                arrived.put(line)
        except DataError as error:
            arrived.put(error)
        arrived.put(None)

    threading.Thread(target=read, name="standard input", daemon=True).start()
    ended: DataError | None | bool = False  # the end (None) or an error seen while a block was filling
    while ended is False:
        first = arrived.get()
        if not isinstance(first, str):
            ended = first
            break
        block, deadline = [first], time.monotonic() + wait_s
        while len(block) < size:
            try:
                line = arrived.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if not isinstance(line, str):  # the end, or an error: after this block
                ended = line
                break
            block.append(line)
        yield block
    if isinstance(ended, DataError):
        raise ended


def standard_input_lines() -> Iterator[str]:
    """The lines of standard input as they arrive, decoded as UTF-8, each without its line break.

    Text that is not UTF-8 (Latin-1, binary data), a closed standard input and one that cannot be read
    (a directory) are each a DataError naming it, as the same text in a file would be.
    """
    if sys.stdin is None:  # started with standard input closed (`<&-`)
        raise DataError("standard input is closed; pipe the text in or pass a file")
    stream = getattr(sys.stdin, "buffer", sys.stdin)  # the bytes, to say which line is not UTF-8
    number = 0
    while True:
        try:
            line = stream.readline()  # one line at a time: an interactive user gets each translation at once
        except OSError as error:
            raise DataError(f"standard input cannot be read ({error.strerror or error}); pipe the text in "
                            "or pass a file") from None
        if not line:
            return
        number += 1
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(f"standard input line {number} is not valid UTF-8 (byte 0x{line[error.start]:02x}); "
                                "re-encode the text as UTF-8 (e.g. iconv -t UTF-8)") from None
        yield line.rstrip("\n").removesuffix("\r")


def check_texts(texts: Sequence[Any], named: str = "line {}", first: int = 1) -> None:
    """Refuse what is not text before any of it is translated: an item that is not a str (ConfigError), or a str
    that UTF-8 cannot hold (DataError): a lone surrogate such as "\\ud800", which is what Python's
    errors="surrogateescape" makes of bytes that are not UTF-8. `named` names an item from its number (`first`
    for the first item): "line {}" (from 1), "texts[{}]" (from 0)."""
    for number, text in enumerate(texts, start=first):
        if not isinstance(text, str):
            raise ConfigError(f"{named.format(number)} is of type {type(text).__name__}, not str; pass text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise DataError(f"{named.format(number)} holds U+{ord(text[error.start]):04X} (character "
                            f"{error.start + 1}), a lone surrogate: bytes that are not UTF-8, not text; pass UTF-8 "
                            "text (re-encode it, e.g. iconv -t UTF-8, or decode the bytes with errors='replace')"
                            ) from None


def _translate_chunk(run: Run, params: Any, texts: list[str], options: DecodeOptions,
                     batching: TranslationBatching, dtype: str, mesh: Mesh | None, first_line: int = 0) -> list[str]:
    check_texts(texts, first=first_line + 1)
    encoded = encode_pairs([(text, "") for text in texts], run.tokenizer)
    # Decode as many rows as there are lines (one for interactive use), not a full eval batch; over a mesh,
    # rounded up to a multiple of its devices (rounded down, a few lines would take two batches).
    rows = len(texts) if mesh is None else round_rows(len(texts), mesh.size)
    batching = batching.replace(batch_size=min(batching.batch_size, rows))
    return translate_encoded(params, run.model_config, encoded, run.tokenizer, options, batching=batching,
                             dtype=dtype, show_progress=False, mesh=mesh, first_row_id=first_line)
