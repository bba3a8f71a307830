"""How long a checkpoint save holds the training thread, against the state's size.

A state of float32 arrays shaped like the base model's (parameters and Adam's two moments, 237 arrays
each: 711 in all, as the base model's 712) is trained by a donating step (every array + 1, which rewrites
the whole state as an update does) and saved with `Checkpointer.save` after every few steps, as train.py's
loop does. Each size runs in a fresh worker process. Per size, the medians of 3 saves:
  blocked      the seconds `save` held the training thread (timing.jsonl's checkpoint_stall_seconds);
  on disk      from the call to the checkpoint complete (blocked + the background's share);
  step delay   the next 3 steps' seconds over 3 steps' without a save (what the background costs the
               steps; on a CPU host the copy, checksums and writes share the cores the steps run on).
The previous save is waited for before each timed one (outside the timing): the interval between saves is
long enough, as it is at the configs' defaults. The comparison with revision c7045af (before the save's copy to
host memory) is in docs/benchmarks/history.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import workers

SIZES_MB = (10, 50, 200, 800)
QUICK_SIZES_MB = (10, 50)
ARRAYS_PER_TREE = 237
SAVES = 3
STEPS_BETWEEN = 3


def _state(megabytes: float) -> Any:
    """Parameters and two moments of ARRAYS_PER_TREE float32 arrays each, `megabytes` in all, on the device."""
    import jax
    import jax.numpy as jnp
    from flax import struct

    @struct.dataclass
    class State:
        params: dict
        opt_state: dict

    elements = max(1, int(megabytes * 2**20 / 4 / 3 / ARRAYS_PER_TREE))
    width = 512 if elements >= 512 else 1
    shape = (max(1, elements // width), width)
    params = {f"w{i}": jnp.full(shape, i / ARRAYS_PER_TREE, jnp.float32) for i in range(ARRAYS_PER_TREE)}
    return State(params=params, opt_state={"mu": jax.tree.map(jnp.zeros_like, params),
                                           "nu": jax.tree.map(jnp.ones_like, params)})


def worker(spec: dict[str, Any]) -> None:
    """Save a state of spec["megabytes"] SAVES times between donating steps; print the timings as one JSON line."""
    import jax

    from transformer_jax.checkpoints import Checkpointer

    state = _state(spec["megabytes"])
    step = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)

    def steps(count: int, state: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        for _ in range(count):
            state = step(state)
        jax.block_until_ready(state)
        return state, time.perf_counter() - start

    state, _ = steps(2, state)  # compiled
    blocked, on_disk, delay = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        checkpointer = Checkpointer(directory, keep=2)
        for index in range(1, SAVES + 1):
            state, plain = steps(STEPS_BETWEEN, state)
            checkpointer.wait()
            start = time.perf_counter()
            checkpointer.save(index, state, {"position": index}, {})
            blocked.append(time.perf_counter() - start)
            state, after = steps(STEPS_BETWEEN, state)
            delay.append(after - plain)
            checkpointer.wait()
            on_disk.append(time.perf_counter() - start)
        checkpointer.close()
    arrays = len(jax.tree.leaves(state))
    print(json.dumps({"megabytes": spec["megabytes"], "arrays": arrays, "blocked_s": blocked,
                      "on_disk_s": on_disk, "step_delay_s": delay}))


def measure(megabytes: float) -> dict[str, Any]:
    """One size in a fresh process."""
    command = workers.worker_command("checkpoint_stall", {"megabytes": megabytes})
    output = subprocess.run(command, cwd=workers.REPO, check=True, capture_output=True, text=True)
    result = json.loads(output.stdout.strip().splitlines()[-1])
    return {**result, **{f"median_{key}": float(np.median(result[key]))
                         for key in ("blocked_s", "on_disk_s", "step_delay_s")}}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every size, one line each."""
    results = []
    for megabytes in QUICK_SIZES_MB if args.quick else SIZES_MB:
        result = measure(megabytes)
        results.append(result)
        print(f"{megabytes:>5} MB ({result['arrays']} arrays)  blocked {result['median_blocked_s']:6.3f} s  "
              f"on disk {result['median_on_disk_s']:6.2f} s  step delay {result['median_step_delay_s']:+6.2f} s",
              flush=True)
    return results
