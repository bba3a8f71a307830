"""A run's failures and what to change: updates skipped as non-finite, parameters that are not finite, and
programs that fail on the device (an out-of-memory, a kernel's error), each said in one line naming the setting to
change and the checkpoint kept. The Trainer (loop.py) raises them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax.errors import DeviceError, TrainingError
from transformer_jax.model.attention_kernels import resolve_backend
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.state import TrainState


# What to lower when updates go non-finite: the learning-rate setting the run uses (see rate_advice).
DEFAULT_RATE_ADVICE = "lower training.learning_rate_scale or set training.grad_clip_norm"


def rate_advice(training: ml_collections.ConfigDict) -> str:
    """What to lower for non-finite updates: the run's own learning-rate setting, with its value."""
    if training.peak_learning_rate:
        return (f"lower training.peak_learning_rate (it is {training.peak_learning_rate:g}) or set "
                "training.grad_clip_norm")
    return (f"lower training.learning_rate_scale (it is {training.learning_rate_scale:g}) or set "
            "training.grad_clip_norm")


# Updates that moved each parameter by at most about this much since the run started (Adam's step is bounded by
# about the learning rate) cannot be what made the loss non-finite: the forward or backward pass is.
STILL_PARAMETERS = 1e-3
# The XLA statuses of a program that failed on the device (a kernel's error, out of memory, a lost device), not of
# a program the code got wrong (INVALID_ARGUMENT, FAILED_PRECONDITION, ...: bugs, which keep their traceback).
DEVICE_FAULTS = ("INTERNAL", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "ABORTED", "DATA_LOSS", "UNKNOWN",
                 "DEADLINE_EXCEEDED")
# What to try when a program fails, or gives non-finite values, with an attention backend: another implementation.
OTHER_ATTENTION = {"cudnn": "fused", "fused": "einsum", "splash": "einsum", "einsum": "fused"}


def non_finite_advice(training: ml_collections.ConfigDict, schedule: Callable[[jax.Array], jax.Array],
                      applied_at_start: int, applied: int, start_step: int, attention: str, dtype: str) -> str:
    """What to change when updates are skipped as non-finite: the learning rate (`rate_advice`) only where the
    updates applied since this start (optimizer counts `applied_at_start` to `applied`, at `schedule`'s rates)
    moved the parameters; else the forward or backward pass is at fault (at learning rate 0 or in the first
    updates): `attention` names the attention backend it runs, with another to try."""
    counts = np.arange(applied_at_start, max(applied, applied_at_start))
    moved = float(np.sum(np.asarray(schedule(counts)))) if counts.size else 0.0
    if moved > STILL_PARAMETERS:
        return rate_advice(training)
    origin = f"the checkpoint of step {start_step}" if start_step else "the initialization"
    how_far = (f"no update since {origin} changed the parameters" if not moved else
               f"the updates since {origin} moved each parameter by at most about {moved:.1g}")
    precision = ", or --config.model.dtype=float32" if dtype != "float32" else ""
    return (f"{how_far}, so the forward or backward pass gives non-finite values, not the learning rate: the "
            f"attention runs on {attention}; try --config.model.attention_backend={OTHER_ATTENTION[attention]}"
            f"{precision}")


def check_skip_streak(state: TrainState, max_skipped_updates: int,
                      newest_checkpoint: Callable[[], int | None] = lambda: None,
                      advice: str | Callable[[], str] = DEFAULT_RATE_ADVICE) -> None:
    """Raise TrainingError once `max_skipped_updates` updates in a row were skipped as non-finite.

    The message names the newest checkpoint on disk, `newest_checkpoint()` (None: there is none), and `advice`
    (or what it returns: computed only for the message).
    """
    streak = int(jax.device_get(state.longest_skip_streak))
    if streak >= max_skipped_updates:
        raise TrainingError(
            f"{streak} updates in a row had a non-finite loss or gradient and were skipped; "
            f"{advice() if callable(advice) else advice} ({kept_checkpoint(newest_checkpoint())})"
        )


def kept_checkpoint(kept_step: int | None) -> str:
    """What a stopped run keeps: its newest checkpoint on disk (None: there is none)."""
    return (f"the last good checkpoint, step {kept_step}, is kept" if kept_step is not None
            else "no checkpoint was written")


def _all_finite(params: Any) -> jax.Array:
    """Whether every parameter is finite: one reduction over the whole tree."""
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(params)]))


@functools.lru_cache(maxsize=8)
def _all_finite_on(sharding: jax.sharding.Sharding | None) -> Callable[[Any], jax.Array]:
    """_all_finite jitted with its result on `sharding` (None: where JAX puts it): made once per mesh in a process,
    so a run started again in the same process (a retry, a notebook cell) traces and compiles it once."""
    return jax.jit(_all_finite, out_shardings=sharding)


def check_trained(state: TrainState, step: int, mesh: jax.sharding.Mesh | None = None,
                  newest_checkpoint: Callable[[], int | None] = lambda: None,
                  advice: str | Callable[[], str] = DEFAULT_RATE_ADVICE) -> None:
    """Raise TrainingError when the run has nothing trained to score: every update skipped, parameters
    that are not finite, or final updates skipped (the state they end in is not saved); a test BLEU of such a
    model would be reported as if it meant something. The message names `newest_checkpoint()`.

    With several processes every one of them calls this: the finiteness is one jitted reduction whose
    replicated result each process reads from its own devices (no process waits alone in a collective).
    """
    replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    all_finite = _all_finite_on(replicated)(state.params)
    skipped = int(np.asarray(_local(state.skipped_updates)))
    advice = advice() if callable(advice) else advice
    if step > 0 and skipped >= step:
        raise TrainingError(f"all {step} updates had a non-finite loss or gradient and were skipped, so the model is "
                            f"untrained; {advice}, and check "
                            "the model settings (e.g. model.layer_norm_epsilon)")
    if not bool(np.asarray(_local(all_finite))):
        raise TrainingError(f"the parameters at step {step} are not finite; the run cannot be scored: restart from an "
                            f"earlier checkpoint and {advice}")
    trailing = int(np.asarray(_local(state.consecutive_skipped)))
    if trailing:  # the state is not saved while updates are skipped (Trainer.save): nothing to resume or score
        raise TrainingError(
            f"the last {trailing} of {step} updates had a non-finite loss or gradient and were skipped, so step {step} "
            f"was not saved and the run cannot be scored ({kept_checkpoint(newest_checkpoint())}); {advice}"
        )


def attention_in_use(model: TransformerConfig, mesh: jax.sharding.Mesh) -> str:
    """The attention backend the run's programs use on `mesh` ("auto" resolved for its platform)."""
    with jax.set_mesh(mesh):
        return resolve_backend(model.attention_backend, model.attention_dropout_rate, model.compute_dtype)


def is_device_fault(error: BaseException) -> bool:
    """Whether `error` is a program's failure on the device (a JaxRuntimeError of one of DEVICE_FAULTS)."""
    return isinstance(error, jax.errors.JaxRuntimeError) and str(error).split(":", 1)[0].strip() in DEVICE_FAULTS


def device_failure(error: Exception, program: str, attention: str, config: ml_collections.ConfigDict,
                   kept_step: int | None) -> DeviceError:
    """The one line for `program` failing on the device with `error` (a JaxRuntimeError): what failed, the attention
    backend it ran, the setting to try (a smaller batch for out of memory), and the checkpoint kept. (A collective
    broken by a dead process never gets here: the Trainer gives the peer watch its time first, base/peer_watch.py.)"""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    detail = lines[0].removesuffix("Traceback (most recent call last):").rstrip(": ")
    detail = (detail + (f" ... {lines[-1]}" if len(lines) > 1 else ""))[:300]
    text, switch = str(error), f"--config.model.attention_backend={OTHER_ATTENTION.get(attention, 'fused')}"
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        what, fix = "ran out of device memory", (
            f"lower --config.data.tokens_per_batch (it is {config.data.tokens_per_batch}) and reach the same batch "
            "with --config.training.accumulation_steps, or set --config.model.remat=dots")
    elif "capture" in text and ("cuda_graph" in text or "command buffer" in text.lower()):
        what, fix = "failed on the device capturing a CUDA graph (XLA's command buffers)", (
            f"try {switch}, or XLA_FLAGS=--xla_gpu_enable_command_buffer= (command buffers off)")
    else:
        what, fix = "failed on the device", f"try {switch}"
    resumes = "; the same command resumes from it" if kept_step is not None else ""
    kept = kept_checkpoint(kept_step)
    return DeviceError(f"{program} {what} (attention: {attention}): {detail}; {fix} ({kept}{resumes})")


def _local(value: Any) -> Any:
    """This process's copy of a replicated value (a NumPy value as it is)."""
    return value.addressable_data(0) if isinstance(value, jax.Array) else value
