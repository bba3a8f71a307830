"""The bound on the host's lead: after each update the host waits for the one dispatched `in_flight` - 1 updates
before, never for the update in flight; and the per-step check costs a training step almost nothing (no copy to
the device, no compile).

benchmarks/sections/preemption.py measures what the bound costs in tokens/s and what it saves a stop.
test_preemption.py tests what the agreement decides: a signal to one process stops every process at the same step.
"""

import time

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.base import make_mesh
from transformer_jax.run.preemption import StopAgreement, StopFlag


@jax.jit
def update(x_NxN: jax.Array) -> jax.Array:
    """A stand-in for a training update: a few hundred milliseconds of matmuls on one CPU device."""
    return jax.lax.fori_loop(0, 100, lambda _, y: jnp.tanh(y @ y), x_NxN)


def agreement(in_flight: int, collective: bool) -> StopAgreement:
    """The agreement over one device (the multi-process path forced on when `collective`), compiled and drained."""
    must_stop = StopAgreement(StopFlag(), make_mesh(devices=jax.devices()[:1]), in_flight, collective=collective)
    for _ in range(in_flight + 1):
        must_stop.after_update(jnp.zeros(()))
    must_stop.between_batches()
    return must_stop


@pytest.mark.parametrize("collective", [False, True])
@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_the_host_waits_for_the_update_in_flight_minus_one_back_never_for_more(in_flight, collective):
    must_stop = agreement(in_flight, collective)
    x = jnp.full((600, 600), 1e-3)
    jax.block_until_ready(update(x))  # compiled
    dispatched = []
    for _ in range(in_flight + 2):
        dispatched.append(update(x))
        assert not must_stop.after_update(dispatched[-1][0, 0])
        unfinished = [not out.is_ready() for out in dispatched]
        # Every update but the newest `in_flight` - 1 is finished: with the next dispatch, at most `in_flight`.
        assert not any(unfinished[:len(dispatched) - (in_flight - 1)]), unfinished
    if in_flight > 1:  # and the host did not wait for the newest: it is still running
        assert not dispatched[-1].is_ready()
    assert must_stop.take_wait() > 0 and must_stop.take_wait() == 0.0  # the waits, handed over once
    jax.block_until_ready(dispatched)


@pytest.mark.parametrize("collective", [False, True])
def test_a_check_copies_nothing_to_the_device_and_compiles_nothing(collective):
    must_stop = agreement(2, collective)
    done = jnp.zeros(())
    checks = 200
    with jax.transfer_guard_host_to_device("disallow"):  # both possible inputs were placed once
        started = time.perf_counter()
        for _ in range(checks):
            must_stop.after_update(done)
        seconds = (time.perf_counter() - started) / checks
    # Tens of µs measured on a loaded 2-core machine; a compile or a blocking exchange per check costs milliseconds.
    assert seconds < 2e-3, f"{seconds * 1e6:.0f} µs per check"
