"""Preemption in-process: the flag and its handler, what the agreement decides and when, and the stop's estimate
against its grace period.

The real command, one process and two, stopped at random points: tests/run/test_stop_latency.py.
"""

import signal

import jax

from transformer_jax.base.sharding import make_mesh
from transformer_jax.run.preemption import StopAgreement, StopFlag, grace_problem, updates_at_stop


def test_a_signal_sets_the_flag_and_later_ones_do_not_cut_the_stop_short(capsys):
    previous = signal.getsignal(signal.SIGTERM)
    flag = StopFlag()
    flag.install()
    try:
        assert not flag.raised
        signal.raise_signal(signal.SIGTERM)
        assert flag.raised and flag.signal_number == signal.SIGTERM
        signal.raise_signal(signal.SIGINT)  # a second one (Ctrl-C) while the checkpoint is written: noted, said
        assert flag.signal_number == signal.SIGTERM and flag.signals == 2
        assert "signal 2 again: stopping after the checkpoint is written" in capsys.readouterr().out
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous  # given back once the loop has finished its saves


def test_one_process_stops_at_the_step_its_signal_arrives_in():
    flag = StopFlag()
    must_stop = StopAgreement(flag, make_mesh(devices=jax.devices()[:1]))
    done = jax.numpy.zeros(())
    assert not must_stop.after_update(done) and not must_stop.between_batches()
    flag.step = 7  # the loop's step when the signal comes
    flag.install()
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        flag.uninstall()
    assert must_stop.after_update(done) and must_stop.between_batches()
    assert flag.arrived_step == 7 and flag.arrived is not None


def test_the_agreement_answers_in_flight_minus_one_steps_after_the_flag_is_set():
    """The multi-process path, run in one process: the answer read after an update is the one started
    `in_flight` - 1 updates before; an evaluation's check reads every pending one and one started now."""
    done = jax.numpy.zeros(())
    for in_flight in (1, 2, 3):
        flag = StopFlag()
        must_stop = StopAgreement(flag, make_mesh(), in_flight, collective=True)
        assert [must_stop.after_update(done) for _ in range(3)] == [False] * 3
        flag.signal_number = signal.SIGTERM
        answers = [must_stop.after_update(done) for _ in range(in_flight)]
        assert answers == [False] * (in_flight - 1) + [True], (in_flight, answers)
    flag = StopFlag()
    must_stop = StopAgreement(flag, make_mesh(), 3, collective=True)
    assert [must_stop.after_update(done) for _ in range(3)] + [must_stop.between_batches()] == [False] * 4
    flag.signal_number = signal.SIGTERM
    assert must_stop.between_batches()


def test_a_stop_waits_for_the_updates_in_flight_and_with_several_processes_the_agreements_lag():
    assert [updates_at_stop(k, 1) for k in (1, 2, 3)] == [1, 2, 3]
    assert [updates_at_stop(k, 2) for k in (1, 2, 3)] == [1, 3, 5]


def test_the_grace_check_says_what_to_change_only_when_the_stop_cannot_fit():
    # 2 updates of 1.6 s and a 5-s write: 8.2 s, inside 30 s; 0 turns the check off.
    assert grace_problem(30, 2, 1, 1.6, 5.0, "/runs/a/checkpoints") == (3.2 + 5.0, None)
    assert grace_problem(0, 2, 1, 60.0, 500.0, "/runs/a/checkpoints")[1] is None
    # Updates too slow for K = 2 with 2 processes (3 updates of 8 s and 4 s: 28 s > 25 s), not for K = 1.
    estimate, line = grace_problem(25, 2, 2, 8.0, 4.0, "gs://b/run/checkpoints")
    assert estimate == 28.0
    assert line.startswith("a stop may not fit its grace period: after SIGTERM the run waits for up to 3 updates "
                           "in flight (8.00 s each) and writes a checkpoint (4.0 s to gs://b/run/checkpoints): about "
                           "28 s, more than training.stop_grace_seconds=25; lower "
                           "--config.training.max_updates_in_flight (1 would stop in about 12 s)")
    assert "faster storage" not in line and line.count("\n") == 0
    # A write longer than the grace period: no setting fits it, and the line says so.
    _, line = grace_problem(30, 1, 1, 0.1, 45.0, "gs://b/run/checkpoints")
    assert "max_updates_in_flight" not in line and "no setting of this run fits it" in line
    assert line.endswith("set --config.training.stop_grace_seconds to it")
