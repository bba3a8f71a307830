"""Host time of the training loop on real batches: where the time between steps goes, against the step alone.

    python -m benchmarks.run --sections loop [--loop_corpus DIR] [--loop_steps N]

Runs `Trainer.run`, train.py's loop (prefetched input, the log window and its progress bar, the per-step
stop check and the bound on the host's lead, checkpoints, the workdir watch), for `--loop_steps` updates on a
corpus: the built-in one, or DIR with train/dev/test.en and .de files (Multi30k for the BENCHMARKS.md figures).
Then the same compiled step alone over the same batches, already on the devices, back to back, once before the
loop and once after.
**host overhead** = the loop's time per update / the step alone's − 1 (issue 31's target: at most 5%).

Each part of the loop is timed by wrapping its method for this section only (the package is not changed):
wall time in the thread that called it (a dispatch can wait for the step before; `window.close` waits for
its window's steps) and that thread's CPU time (host work). The prefetch thread builds and copies batches
beside the step; on a CPU host its CPU time competes with the step's, on an accelerator it overlaps.

Three cases on the same batches of 4,096 token slots: issue 31's recipe (d_model 256, 3 + 3 layers: about a
second a step on 2 CPU cores) checkpointing every 50 updates, as the time_to_bleu rounds do; and a tiny model
(d_model 64, 1 + 1 layers, 2 heads: a quarter of that), where the same host work is a larger share, checkpointing
every 50 updates and at the default (every 1,000: only the last update's checkpoint falls in the timed span).
Start-up (preparing the corpus, compiling) is reported apart: once per run, not per step.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import os
import tempfile
import time
from typing import Any, Callable, Iterator
from unittest import mock

import jax

from transformer_jax.config import default_config
from transformer_jax.data import BatchIterator
from transformer_jax.run import LogWindow, PeriodicEval, StopAgreement, Trainer, assemble_run

RECIPE = dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4)
TINY = dict(num_layers=1, d_model=64, d_ff=256, num_heads=2)
CASES = {  # name: (model, updates between checkpoints)
    "recipe, checkpoint every 50": (RECIPE, 50),
    "tiny, checkpoint every 50": (TINY, 50),
    "tiny, checkpoint every 1,000 (default)": (TINY, 1_000),
}
LOOP_MODULE = inspect.getmodule(Trainer)  # the loop calls its module's check_skip_streak by name
# (owner, attribute, what the part is): the loop's parts, each timed where it runs.
PARTS = (
    (Trainer, "update", "update: batches + dispatch of the step"),
    (Trainer, "_next_global_batch", "  next batch from the prefetch queue"),
    (BatchIterator, "__next__", "build a packed batch (prefetch thread)"),
    (Trainer, "_place", "copy it to the devices (prefetch thread)"),
    (LogWindow, "add", "log window: add a step (progress bar)"),
    (LogWindow, "close", "log window: close (waits for its steps; logs)"),
    (StopAgreement, "after_update", "stop check and the bound's wait (an earlier update)"),
    (Trainer, "_check_workdir", "workdir check"),
    (LOOP_MODULE, "check_skip_streak", "skipped-update check"),
    (PeriodicEval, "__call__", "periodic evaluation (none due)"),
    (Trainer, "save", "checkpoint save"),
)


def run_config(corpus: str | None, model: dict[str, int], steps: int, tokens_per_batch: int,
               checkpoint_every: int = 50) -> Any:
    """The time_to_bleu recipe's run settings with `model`, for `steps` updates, logging every 50."""
    config = default_config()
    config.data.source, config.data.path = ("text", corpus) if corpus else ("builtin", "")
    # The built-in corpus's words make fewer than 8,000 pieces (6,760): its own demo's 4,000.
    config.data.update(vocab_size=8_000 if corpus else 4_000, tokens_per_batch=tokens_per_batch, max_length=128)
    config.model.update(dropout_rate=0.1, max_len=256, **model)
    config.training.update(num_train_steps=steps, warmup_steps=300, peak_learning_rate=1e-3, log_every=50,
                           eval_every=10**9, bleu_every=0, checkpoint_every=checkpoint_every)
    return config


class Parts:
    """Wall and thread-CPU seconds and calls of each wrapped part."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = collections.defaultdict(float)
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()

    def timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.wall[name] += time.perf_counter() - wall
                self.cpu[name] += time.thread_time() - cpu
                self.calls[name] += 1
        return wrapped

    @contextlib.contextmanager
    def wrapping(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for owner, attribute, name in PARTS:
                stack.enter_context(mock.patch.object(owner, attribute, self.timed(name, getattr(owner, attribute))))
            yield


def step_alone(trainer: Trainer, batches: list[Any]) -> float:
    """Seconds per update of the compiled step over `batches` (on the devices), back to back, from a fresh state."""
    state = trainer.programs.init_state()
    jax.block_until_ready(state)
    started = time.perf_counter()
    for batch in batches:
        state, metrics = trainer.programs.train_step(state, batch)
    jax.block_until_ready((state, metrics))
    return (time.perf_counter() - started) / len(batches)


def measure(corpus: str | None, model: dict[str, int], steps: int, tokens_per_batch: int,
            checkpoint_every: int) -> dict[str, Any]:
    """One case: start-up, the loop's time per update and its parts, and the step alone before and after."""
    config = run_config(corpus, model, steps, tokens_per_batch, checkpoint_every)
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        trainer = Trainer(assemble_run(config, workdir))
        prepared = time.perf_counter()
        trainer.compile_steps()
        compile_done = time.perf_counter()
        position = trainer.data.train.get_state()
        batches = [trainer._place(next(trainer.data.train)) for _ in range(steps)]
        before = step_alone(trainer, batches)
        trainer.data.train.set_state(position)  # the loop sees the same batches
        parts, span = Parts(), {}
        train = Trainer._train

        def timed_train(self: Trainer, *args: Any) -> int:
            span["start"] = time.perf_counter()
            reached = train(self, *args)
            jax.block_until_ready(self.state)
            span["end"] = time.perf_counter()
            return reached

        compiled = trainer.programs.train_step.jitted._cache_size()
        with parts.wrapping(), mock.patch.object(Trainer, "_train", timed_train):
            trainer.run()
        compiled_in_loop = trainer.programs.train_step.jitted._cache_size() - compiled
        trainer.close()
        after = step_alone(trainer, batches)
        real = sum(int((batch["targets"] > 0).sum()) for batch in jax.device_get(batches))
    per_update = (span["end"] - span["start"]) / steps
    alone = (before + after) / 2
    return {
        "steps": steps, "prepare_s": prepared - started, "compile_s": compile_done - prepared,
        "shapes": len(trainer.programs.shapes.train), "compiles_in_loop": compiled_in_loop,
        "loop_ms": 1e3 * per_update, "alone_ms_before": 1e3 * before, "alone_ms_after": 1e3 * after,
        "host_overhead": per_update / alone - 1.0, "real_target_tokens_per_update": real / steps,
        "parts": {name: {"wall_ms": 1e3 * parts.wall[name] / steps, "cpu_ms": 1e3 * parts.cpu[name] / steps,
                         "calls": parts.calls[name]} for _, _, name in PARTS},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    steps = 10 if args.quick else args.loop_steps
    corpus = os.path.abspath(args.loop_corpus) if args.loop_corpus else None
    print(f"  corpus: {corpus or 'built-in'}; {steps} updates of 4,096 token slots; a log line every 50", flush=True)
    results = {}
    for name, (model, checkpoint_every) in CASES.items():
        result = results[name] = measure(corpus, model, steps, 4_096, checkpoint_every)
        print(f"  {name}: start-up {result['prepare_s']:.1f} s preparing + {result['compile_s']:.1f} s compiling; "
              f"loop {result['loop_ms']:.1f} ms/update, step alone {result['alone_ms_before']:.1f} (before) / "
              f"{result['alone_ms_after']:.1f} (after) ms: host overhead {result['host_overhead']:+.1%}; "
              f"{result['real_target_tokens_per_update']:.0f} real target tokens/update; "
              f"{result['shapes']} batch shape(s), {result['compiles_in_loop']} compiled inside the loop", flush=True)
        for part, figures in result["parts"].items():
            each = figures["wall_ms"] * steps / max(figures["calls"], 1)
            print(f"    {part:<48} {figures['wall_ms']:8.2f} ms wall {figures['cpu_ms']:8.2f} ms CPU per update "
                  f"({figures['calls']} calls, {each:.2f} ms wall each)", flush=True)
    return {"corpus": corpus or "builtin", **results}
