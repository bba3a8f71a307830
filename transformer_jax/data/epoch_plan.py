"""An epoch's batch plan: which training pairs go in which rows of which batch, and the rows built from it.

A plan is a pure function of the corpus's lengths and a seeded generator (batching.py draws one per
epoch): `plan_buckets` groups pairs by length (the paper's batching), `plan_packed` places them
first-fit into rows of a few widths with segment ids (`first_fit`). `materialize` reads one batch's
pairs from the corpus and lays them out (`place_sequences`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.data.shapes import rows_per_batch
from transformer_jax.errors import DataError
from transformer_jax.model.special_tokens import BOS_ID, PAD_ID

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Where every pair of one epoch goes: items sorted by batch, then row.

    Batch b holds items[batch_starts[b]:batch_starts[b + 1]] in a [batch_rows[b], batch_lengths[b]]
    array; each item sits in `rows` at column `source_offsets` / `target_offsets` as segment `segments`.
    """

    items: np.ndarray
    rows: np.ndarray
    source_offsets: np.ndarray
    target_offsets: np.ndarray
    segments: np.ndarray
    batch_starts: np.ndarray
    batch_rows: np.ndarray
    batch_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.batch_rows)

    def efficiency(self, corpus: EncodedPairs) -> float:
        """Real tokens / token slots over inputs and targets of the whole epoch."""
        real = corpus.source.lengths[self.items].sum() + corpus.target.lengths[self.items].sum()
        return float(real / (2 * np.sum(self.batch_rows * self.batch_lengths)))


def finish_plan(items: np.ndarray, batches: np.ndarray, rows: np.ndarray, source_offsets: np.ndarray,
                 target_offsets: np.ndarray, segments: np.ndarray, batch_rows: np.ndarray,
                 batch_lengths: np.ndarray) -> EpochPlan:
    """Sort per-item placements by (batch, row) and index the batches."""
    order = np.lexsort((rows, batches))
    counts = np.bincount(batches, minlength=len(batch_rows))
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # int32 throughout: a plan of 10M pairs is 5 arrays of 40 MB (int64 would double a process's memory).
    small = lambda array: array[order].astype(np.int32, copy=False)  # noqa: E731
    return EpochPlan(small(items), small(rows), small(source_offsets), small(target_offsets),
                     small(segments), starts, batch_rows, batch_lengths)


def plan_buckets(corpus: EncodedPairs, rng: np.random.Generator, tokens_per_batch: int,
                 buckets: Sequence[int], row_multiple: int) -> EpochPlan:
    """One pair per row; pairs grouped by bucket (the smallest bucket >= both lengths), batches shuffled."""
    permutation = rng.permutation(len(corpus))
    longest = np.maximum(corpus.source.lengths, corpus.target.lengths)[permutation]
    bucket_of = np.searchsorted(np.asarray(buckets), longest)
    if bucket_of.max() >= len(buckets):
        raise DataError(f"a training pair has {longest.max()} tokens, more than the largest bucket "
                        f"{buckets[-1]}; filter the corpus with max_length first")
    items, batch_ids, rows, batch_rows, batch_lengths = [], [], [], [], []
    for bucket, length in enumerate(buckets):
        members = permutation[bucket_of == bucket]
        if len(members) == 0:
            continue
        per_batch = rows_per_batch(tokens_per_batch, length, row_multiple)
        first_batch = len(batch_rows)
        num_batches = -(-len(members) // per_batch)
        items.append(members)
        batch_ids.append(first_batch + np.arange(len(members)) // per_batch)
        rows.append(np.arange(len(members)) % per_batch)
        batch_rows += [per_batch] * num_batches
        batch_lengths += [length] * num_batches
    # Batches were made bucket by bucket; shuffle their order so lengths are mixed through the epoch.
    new_id = rng.permutation(len(batch_rows))
    batch_rows = np.asarray(batch_rows)[np.argsort(new_id)]
    batch_lengths = np.asarray(batch_lengths)[np.argsort(new_id)]
    items, rows = np.concatenate(items), np.concatenate(rows)
    zeros = np.zeros_like(items)
    return finish_plan(items, new_id[np.concatenate(batch_ids)], rows, zeros, zeros, zeros + 1,
                        batch_rows, batch_lengths)


def first_fit(source_lengths: Sequence[int] | np.ndarray, target_lengths: Sequence[int] | np.ndarray, width: int,
              open_rows: int = 16, chunk_size: int = 1 << 20, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Place pairs in order, first-fit, into rows of `width` tokens (both sides), keeping `open_rows` open.

    Returns each pair's (row, source offset, target offset, segment) [N, 4] (written to `out` when given)
    and the number of rows. The lengths are turned into Python ints `chunk_size` pairs at a time (a whole 10M-pair corpus's
    would take 0.5 GB of lists); the open rows carry over from chunk to chunk.
    """
    placement = np.zeros((len(source_lengths), 4), dtype=np.int32) if out is None else out
    rows: list[list[int]] = []  # open rows: [row id, source used, target used, segments]
    next_row = 0
    for begin in range(0, len(source_lengths), chunk_size):
        sources = np.asarray(source_lengths[begin:begin + chunk_size]).tolist()
        targets = np.asarray(target_lengths[begin:begin + chunk_size]).tolist()
        for i, (source_length, target_length) in enumerate(zip(sources, targets), start=begin):
            for row in rows:
                if row[1] + source_length <= width and row[2] + target_length <= width:
                    break
            else:
                if len(rows) == open_rows:
                    rows.pop(0)  # the oldest open row is usually the fullest: close it
                row = [next_row, 0, 0, 0]
                rows.append(row)
                next_row += 1
            row[3] += 1
            placement[i] = (row[0], row[1], row[2], row[3])
            row[1] += source_length
            row[2] += target_length
    return placement, next_row


def plan_packed(corpus: EncodedPairs, rng: np.random.Generator, rows_per_width: dict[int, int], length: int,
                open_rows: int = 16, long_length: int | None = None) -> EpochPlan:
    """Pairs placed first-fit into rows of `length` tokens (both sides), keeping `open_rows` rows open.

    With `long_length`, pairs longer than `length` are packed into rows of their own, `long_length`
    tokens wide, in batches of their own (two shapes); the batches of both widths are shuffled together.
    A batch of width W holds `rows_per_width[W]` rows.
    """
    permutation = rng.permutation(len(corpus)).astype(np.int32)  # int32 plans: see finish_plan
    longest = np.maximum(corpus.source.lengths, corpus.target.lengths)[permutation]
    widest = long_length or length
    if longest.max() > widest:
        raise DataError(f"a training pair is longer than the packed row length {widest}; "
                        "filter the corpus with max_length first")
    fits = longest <= length
    del longest
    groups = [(permutation, length)] if fits.all() else [(permutation[fits], length), (permutation[~fits], widest)]
    del fits
    # One array for every pair's placement and batch, filled group by group (no concatenated copies: a
    # 10M-pair epoch's placements are 160 MB).
    placement = np.empty((len(permutation), 4), np.int32)
    batches = np.empty(len(permutation), np.int32)
    batch_rows, batch_lengths, start = [], [], 0
    for members, width in groups:
        end = start + len(members)
        _, num_rows = first_fit(corpus.source.lengths[members], corpus.target.lengths[members], width,
                                open_rows, out=placement[start:end])
        per_batch = rows_per_width[width]
        np.floor_divide(placement[start:end, 0], per_batch, out=batches[start:end])
        batches[start:end] += len(batch_rows)
        placement[start:end, 0] %= per_batch
        num_batches = -(-num_rows // per_batch)
        batch_rows += [per_batch] * num_batches
        batch_lengths += [width] * num_batches
        start = end
    items = groups[0][0] if len(groups) == 1 else np.concatenate([members for members, _ in groups])
    del groups, permutation
    batch_rows, batch_lengths = np.asarray(batch_rows), np.asarray(batch_lengths)
    if len(batch_lengths) and len(set(batch_lengths.tolist())) > 1:  # mix the two widths through the epoch
        new_id = rng.permutation(len(batch_rows)).astype(np.int32)
        batches = new_id[batches]
        batch_rows, batch_lengths = batch_rows[np.argsort(new_id)], batch_lengths[np.argsort(new_id)]
    return finish_plan(items, batches, placement[:, 0], placement[:, 1], placement[:, 2],
                        placement[:, 3], batch_rows, batch_lengths)


def materialize(corpus: EncodedPairs, plan: EpochPlan, batch: int, packed: bool,
                process_index: int = 0, process_count: int = 1) -> Batch:
    """This process's block of rows [p * n, (p + 1) * n) of one planned batch (n = rows / process_count)."""
    begin, end = plan.batch_starts[batch], plan.batch_starts[batch + 1]
    rows = plan.rows[begin:end]
    per_process = int(plan.batch_rows[batch]) // process_count
    mine = rows // per_process == process_index
    pairs = corpus.read(plan.items[begin:end][mine])  # only this process's pairs are read
    items = np.arange(len(pairs))
    shape = (per_process, int(plan.batch_lengths[batch]))
    local_rows = rows[mine] - process_index * per_process
    result = {}
    for name, side, offsets in (("inputs", pairs.source, plan.source_offsets),
                                ("targets", pairs.target, plan.target_offsets)):
        placed = place_sequences(side, items, local_rows, offsets[begin:end][mine], plan.segments[begin:end][mine], shape)
        result[name] = placed["tokens"]
        if name == "targets":
            result["target_inputs"] = placed["shifted"]
        if packed:
            result[f"{name}_segmentation"] = placed["segments"]
            result[f"{name}_position"] = placed["positions"]
    return result


def place_sequences(side: Ragged, items: np.ndarray, rows: np.ndarray, offsets: np.ndarray, segments: np.ndarray,
           shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Scatter the items' tokens into a padded [rows, length] array, all at once (no Python loop)."""
    lengths = side.lengths[items].astype(np.int64)
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(items)), lengths)  # item of each token
    position = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    source = side.starts[items][owner] + position
    destination = rows[owner] * shape[1] + offsets[owner] + position
    tokens = side.values[source]
    # Shift right inside each segment: every segment starts with its own BOS.
    shifted = np.where(position == 0, BOS_ID, side.values[np.maximum(source - 1, 0)])
    out = {}
    for key, values in (("tokens", tokens), ("shifted", shifted), ("segments", segments[owner]),
                        ("positions", position)):
        array = np.full(shape[0] * shape[1], PAD_ID, dtype=np.int32)
        array[destination] = values
        out[key] = array.reshape(shape)
    return out
