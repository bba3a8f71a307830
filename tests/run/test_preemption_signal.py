"""The per-step stop agreement costs a training step almost nothing: the host never waits for the update in
flight, and a check is one small dispatch.

This is what keeps the agreement off the step time (benchmarks/sections/preemption.py measures it in a
2-process run). test_preemption.py tests what it decides: a signal to one process stops every process
at the same step.
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


@pytest.fixture
def must_stop() -> StopAgreement:
    """The multi-process agreement, forced on over one device, compiled and with its last result read."""
    agreement = StopAgreement(StopFlag(), make_mesh(devices=jax.devices()[:1]), collective=True)
    for _ in range(3):
        agreement()
    return agreement


def test_a_check_waits_for_the_previous_update_not_the_one_in_flight(must_stop):
    x = jnp.full((700, 700), 1e-3)
    jax.block_until_ready(update(x))  # compiled
    previous = update(x)
    must_stop()  # starts this step's agreement, dispatched after `previous`
    in_flight = update(x)
    assert not must_stop()  # reads the agreement started one step ago
    # The devices run programs in dispatch order: the answer was ready once `previous` was, and the host
    # did not wait for `in_flight` (reading this step's own agreement would have).
    assert previous.is_ready()
    assert not in_flight.is_ready()
    jax.block_until_ready(in_flight)


def test_a_check_copies_nothing_to_the_device_and_compiles_nothing(must_stop):
    checks = 200
    with jax.transfer_guard_host_to_device("disallow"):  # both possible inputs were placed once
        started = time.perf_counter()
        for _ in range(checks):
            must_stop()
        seconds = (time.perf_counter() - started) / checks
    # 22 µs measured on a loaded 2-core machine; a compile or a blocking exchange per check costs milliseconds.
    assert seconds < 2e-3, f"{seconds * 1e6:.0f} µs per check"
