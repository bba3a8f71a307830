"""Token-budget batches from a pre-tokenized corpus: length buckets, packing, host sharding.

Every epoch is planned up front (epoch_plan.py) by a pure function of (seed, epoch): a seeded
permutation of the corpus, then either
- bucketing: pairs grouped by length; a batch of bucket length L holds tokens_per_batch // L rows,
  so every batch has about the same number of token slots (the paper's batching), or
- packing: pairs placed first-fit into rows of `row_width` tokens, several pairs to a row, with
  segment ids and positions; pairs longer than the row width (up to max_length) are packed into rows
  of their own, as wide as the longest pair, in batches of their own: one or two static shapes.
  `max_length` is the length filter; the row width is a separate setting (see row_width.py, which
  chooses it from the corpus). A batch of width W holds tokens_per_batch // W rows, or the rows given
  per width (`rows_per_width`: row_width.py sizes them so that each batch holds about the real tokens
  of rows of max_length).
Shapes come from a small fixed set, so `jit` compiles once per bucket. Rows of each global batch are
dealt out to the processes in contiguous blocks (process p gets the p-th block), so every process gets
the same number of steps with the same shapes, the shards are disjoint and cover the epoch, and the
global batch (the blocks in process order) is the batch a single process would read.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence

import numpy as np

from transformer_jax.data.encoded import EncodedPairs
from transformer_jax.data.epoch_plan import Batch, EpochPlan, finish_plan, materialize, plan_buckets, plan_packed
from transformer_jax.data.shapes import BATCH_KEYS, PACKED_KEYS, WIDTH_MULTIPLE, length_buckets, round_rows, round_up, round_width, rows_per_batch
from transformer_jax.errors import DataError

# Corpora from this size on plan their next epoch in the background (a smaller one plans in milliseconds).
PLAN_AHEAD_PAIRS = 100_000


class BatchIterator:
    """Endless training batches (or `num_epochs` epochs), with a resumable position.

    The state is three integers, {"seed", "epoch", "position"}, plus what the epoch plans depend on
    (the corpus size and the "layout": batch shapes and the settings that chose them), so it saves
    as JSON; restoring it gives exactly the batches an uninterrupted run would have seen next, or a
    DataError when this iterator plans its epochs differently (another device count or batch size).
    """

    def __init__(self, corpus: EncodedPairs, tokens_per_batch: int, max_length: int, pack: bool = True,
                 buckets: Sequence[int] | None = None, row_multiple: int = 1, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, num_epochs: int | None = None,
                 row_width: int | None = None, rows_per_width: dict[int, int] | None = None,
                 width_multiple: int = WIDTH_MULTIPLE):
        if not 0 <= process_index < process_count:
            raise DataError(f"process_index={process_index} is outside [0, process_count={process_count})")
        if len(corpus) == 0:
            raise DataError("the training corpus is empty; check the training data")
        self.corpus, self.tokens_per_batch, self.max_length, self.pack = corpus, tokens_per_batch, max_length, pack
        self.buckets = tuple(buckets) if buckets else length_buckets(max_length)
        # Packed rows: `row_width` (default max_length); longer pairs get rows as wide as the longest
        # pair rounded up to 8 (at most max_length), so a corpus far below max_length never pays for it.
        self.row_width = min(row_width or max_length, max_length)
        longest = int(max(corpus.source.lengths.max(), corpus.target.lengths.max())) if len(corpus) else 0
        self.width_multiple = width_multiple  # the chip's tile (shapes.width_multiple) the long rows round to
        self.long_width = (min(max_length, round_width(longest, multiple=width_multiple))
                           if longest > self.row_width else None)
        # Each global batch's rows are dealt out to the processes, so rows must divide evenly.
        self.row_multiple = math.lcm(row_multiple, process_count)
        self.devices = row_multiple  # as given: recorded in the state to explain a change of layout
        # Global rows per packed width (row_width.py's, sized by real tokens); None: tokens_per_batch // width.
        self.rows_per_width = dict(rows_per_width) if rows_per_width and pack else None
        if self.rows_per_width is not None:
            missing = [w for w in self.widths() if w not in self.rows_per_width]
            uneven = {w: r for w, r in self.rows_per_width.items() if r <= 0 or r % self.row_multiple}
            if missing or uneven:
                raise ValueError(f"rows_per_width={rows_per_width} lacks the widths {missing} or has rows that are not "
                                 f"a positive multiple of {self.row_multiple}: {uneven}")
        self.seed, self.process_index, self.process_count = seed, process_index, process_count
        self.num_epochs = num_epochs
        self.epoch, self.position = 0, 0
        self._plans: dict[int, EpochPlan] = {}  # the current epoch's plan and, once made, the next one's
        self._planning: tuple[int, threading.Thread] | None = None  # the next epoch's, in the background

    def for_process(self, process_index: int, process_count: int) -> BatchIterator:
        """The iterator one process of `process_count` would have over the same corpus and plan (from the start)."""
        return BatchIterator(self.corpus, self.tokens_per_batch, self.max_length, self.pack, self.buckets,
                             self.devices, self.seed, process_index, process_count, self.num_epochs,
                             self.row_width, self.rows_per_width, self.width_multiple)

    def plan(self, epoch: int) -> EpochPlan:
        """The global plan of one epoch, a pure function of (seed, epoch); this epoch's and the next are kept."""
        ahead = self._planning
        if ahead is not None and ahead[0] == epoch:
            ahead[1].join()  # being planned in the background: wait for it rather than plan it twice
        if epoch not in self._plans:
            self._plans = {epoch: self._make_plan(epoch)}
        elif len(self._plans) > 1 and min(self._plans) < epoch:
            self._plans = {e: plan for e, plan in self._plans.items() if e >= epoch}  # past epochs let go
        return self._plans[epoch]

    def _make_plan(self, epoch: int) -> EpochPlan:
        rng = np.random.default_rng([self.seed, epoch])
        if self.pack:
            rows = {width: self.global_rows(width) for width in self.widths()}
            return plan_packed(self.corpus, rng, rows, self.row_width, long_length=self.long_width)
        return plan_buckets(self.corpus, rng, self.tokens_per_batch, self.buckets, self.row_multiple)

    def _plan_next_epoch(self) -> None:
        """Plan the next epoch in a background thread, so the first batch after an epoch boundary does not
        wait for it (4.5M pairs take seconds to plan; the devices would idle that long)."""
        epoch = self.epoch + 1
        if epoch in self._plans or (self._planning is not None and self._planning[0] == epoch) or (
                self.num_epochs is not None and epoch >= self.num_epochs):
            return

        def make() -> None:
            plan = self._make_plan(epoch)
            self._plans = {**{e: p for e, p in self._plans.items() if e == self.epoch}, epoch: plan}

        thread = threading.Thread(target=make, name="plan-next-epoch", daemon=True)
        self._planning = (epoch, thread)
        thread.start()

    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, length) shapes this process's batches can take: one per row width or bucket used."""
        lengths = self.widths() if self.pack else [b for b in self.buckets if b <= self.max_length]
        return [(self.global_rows(b) // self.process_count, b) for b in lengths]

    def global_rows(self, length: int) -> int:
        """Rows of a global batch of this width or bucket length: as given per width, else the token budget's."""
        if self.rows_per_width is not None:
            return self.rows_per_width[length]
        return rows_per_batch(self.tokens_per_batch, length, self.row_multiple)

    def batch_shapes(self) -> list[tuple[int, int]]:
        """The global (rows, length) shapes of the batches an epoch holds (every epoch the same ones), sorted."""
        plan = self.plan(self.epoch)
        return sorted(set(zip(plan.batch_rows.tolist(), plan.batch_lengths.tolist())))

    def batch_keys(self) -> tuple[str, ...]:
        """The names of the arrays of every batch."""
        return PACKED_KEYS if self.pack else BATCH_KEYS

    def widths(self) -> list[int]:
        """Packed row widths: the row width, then the long pairs' width when some pair exceeds it."""
        return [self.row_width] + ([self.long_width] if self.long_width else [])

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Batch:
        if self.position >= len(self.plan(self.epoch)):
            self.epoch, self.position = self.epoch + 1, 0
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        batch = materialize(self.corpus, self.plan(self.epoch), self.position, self.pack,
                            self.process_index, self.process_count)
        if self.position == 0 and len(self.corpus) >= PLAN_AHEAD_PAIRS:
            self._plan_next_epoch()
        self.position += 1
        return batch

    def layout(self) -> dict[str, object]:
        """What the epoch plans depend on besides seed and corpus, and the settings that chose it.

        Two iterators plan identical epochs exactly when `pack` and `batch_shapes` (the global
        [rows, length] of every bucket) agree; the other entries name the settings for messages.
        """
        lengths = self.widths() if self.pack else list(self.buckets)
        # The rows of rows_per_batch, without its error: a state is saved whatever the buckets.
        shapes = [[self.rows_per_width[length] if self.rows_per_width else
                   self.tokens_per_batch // length // self.row_multiple * self.row_multiple, length]
                  for length in lengths]
        return {"pack": self.pack, "batch_shapes": shapes, "tokens_per_batch": self.tokens_per_batch,
                "max_length": self.max_length, "row_width": self.row_width if self.pack else None,
                "rows_sized_for": "real tokens" if self.rows_per_width else "slots",
                "devices": self.devices, "process_count": self.process_count}

    def get_state(self) -> dict[str, object]:
        """Position of the next batch and what the epoch plans depend on, JSON-serializable."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position,
                "num_examples": len(self.corpus), "layout": self.layout()}

    @staticmethod
    def state_problem(state: object) -> str | None:
        """What makes `state` no record `get_state` could have written (a damaged checkpoint); None: well-formed.

        Only the shape and types are checked: a record of another seed or corpus is `set_state`'s refusal.
        """
        count = lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not isinstance(state, dict):
            return f"it is a JSON {type(state).__name__}, not an object"
        for key in ("seed", "epoch", "position", "num_examples"):
            if not count(state.get(key)):
                return f"{key} is {json.dumps(state.get(key))[:40]}, not a count"
        layout = state.get("layout", {"pack": False, "batch_shapes": []})
        shapes = layout.get("batch_shapes") if isinstance(layout, dict) else None
        if not (isinstance(layout, dict) and isinstance(layout.get("pack"), bool) and isinstance(shapes, list)
                and all(isinstance(shape, list) and len(shape) == 2 and all(map(count, shape)) for shape in shapes)):
            return "its layout is not {pack, batch_shapes: [[rows, length], ...], ...}"
        return None

    def set_state(self, state: dict[str, object]) -> None:
        """Continue from a state saved by `get_state` (same corpus and seed, epochs planned alike).

        A state without "layout" (saved before it was recorded) is taken as planned alike. Its shape is
        `state_problem`'s to check (a restore does, before calling this).
        """
        if state["seed"] != self.seed:
            raise DataError(f"training.seed={self.seed} differs from the {state['seed']} the run's data position was "
                            f"saved with; set --config.training.seed={state['seed']}, or use a new workdir")
        if state["num_examples"] != len(self.corpus):
            saved_length = state.get("layout", {}).get("max_length")
            fix = (f"set --config.data.max_length={saved_length} (it was {saved_length}, now {self.max_length})"
                   if saved_length not in (None, self.max_length) else "resume with the data settings the run was started with")
            raise DataError(f"the run's data position was saved for {state['num_examples']} training pairs, but the "
                            f"corpus now gives {len(self.corpus)}; {fix}, or use a new workdir")
        if "layout" in state:
            self._check_same_plan(state["layout"], self.layout())
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    # How each setting of the layout is named in the error of a changed plan.
    _LAYOUT_NAMES = {"devices": "devices", "process_count": "processes", "tokens_per_batch": "data.tokens_per_batch",
                     "max_length": "data.max_length", "row_width": "data.row_width", "pack": "data.pack",
                     "rows_sized_for": "rows sized for"}

    @classmethod
    def _check_same_plan(cls, saved: dict[str, object], current: dict[str, object]) -> None:
        """Raise DataError naming what changed when `current` plans other batches than `saved`."""
        if saved["pack"] == current["pack"] and saved["batch_shapes"] == current["batch_shapes"]:
            return  # the same epochs, batch for batch: the saved position is exact
        changes = [f"{label} {saved[key]} -> {current[key]}" for key, label in cls._LAYOUT_NAMES.items()
                   if key in saved and saved[key] != current[key]]
        shapes = lambda layout: ", ".join(f"{rows}x{length}" for rows, length in layout["batch_shapes"])
        changed = "; ".join(changes) or "other buckets or rows per width"
        raise DataError(
            f"cannot resume the data position: the checkpoint's batches are {shapes(saved)} (rows x tokens), "
            f"this run's would be {shapes(current)} ({changed}); resume with the checkpoint's device count and "
            f"data settings{cls._resume_hint(saved, current)}, or start a new workdir"
        )

    @staticmethod
    def _resume_hint(saved: dict[str, object], current: dict[str, object]) -> str:
        """The data.row_width that plans the checkpoint's packed rows again, when one does ("" otherwise)."""
        if not (saved["pack"] and current["pack"] and saved["batch_shapes"] and current["batch_shapes"]):
            return ""
        width, sizing = saved["batch_shapes"][0][1], saved.get("rows_sized_for", "slots")  # older states: slots
        if sizing == "slots" and (width != current["batch_shapes"][0][1] or current["rows_sized_for"] != "slots"):
            # Rows of tokens_per_batch slots at another width (e.g. a checkpoint from before the width or
            # the rows were chosen from the corpus): an explicit width plans them again.
            return f" (--config.data.row_width={width})"
        if sizing != "slots" and current["rows_sized_for"] == "slots":
            return " (--config.data.row_width=0, rows sized from the corpus)"
        return ""


def eval_batches(corpus: EncodedPairs, batch_size: int, buckets: Sequence[int] = (16, 32, 64, 128, 256),
                 process_index: int = 0, process_count: int = 1, row_multiple: int = 1) -> list[Batch]:
    """Every pair of a dev/test set exactly once, never filtered: fixed rows, a few lengths.

    Pairs are sorted by length so little padding is decoded; `index` [B] gives each row's position in
    the original corpus (-1 for padding rows) so outputs can be put back in order. Each batch holds
    `batch_size` pairs in rows padded up to a multiple of `row_multiple` (e.g. the mesh size, so every
    device gets as many rows); padding rows are all PAD.
    """
    batch_rows = round_rows(batch_size, row_multiple)
    if batch_rows % process_count:
        raise DataError(f"eval batch_size={batch_size} must be a multiple of process_count={process_count}")
    if len(corpus) == 0:
        return []
    longest = np.maximum(corpus.source.lengths, corpus.target.lengths)
    order = np.argsort(-longest, kind="stable")
    num_batches = -(-len(order) // batch_size)
    batch_ids = np.arange(len(order)) // batch_size
    # Batch length: the smallest bucket that fits; longer than all buckets: the next multiple of the last.
    batch_longest = np.maximum.reduceat(longest[order], np.arange(0, len(order), batch_size))
    lengths = [next((b for b in buckets if b >= n), round_up(n, buckets[-1])) for n in batch_longest]
    rows = np.arange(len(order)) % batch_size
    zeros = np.zeros_like(order)
    plan = finish_plan(order, batch_ids, rows, zeros, zeros, zeros + 1,
                        np.full(num_batches, batch_rows), np.asarray(lengths))
    per_process = batch_rows // process_count
    batches = []
    for b in range(num_batches):
        batch = materialize(corpus, plan, b, False, process_index, process_count)
        index = np.full(batch_rows, -1, dtype=np.int32)
        index[rows[batch_ids == b]] = order[batch_ids == b]
        batch["index"] = index[process_index * per_process:(process_index + 1) * per_process]
        batches.append(batch)
    return batches


def restore_order(outputs: Sequence[str], indices: Sequence[int], num_examples: int) -> list[str]:
    """Put per-row outputs back in corpus order using the eval batches' `index` (rows with -1 dropped)."""
    ordered: list[str | None] = [None] * num_examples
    for output, index in zip(outputs, indices):
        if index >= 0:
            ordered[index] = output
    missing = [i for i, text in enumerate(ordered) if text is None]
    if missing:
        raise ValueError(f"{len(missing)} examples have no output (first: {missing[0]})")
    return ordered  # type: ignore[return-value]
