"""The progress bar: it counts completed steps in order, and its rate (ETA) leaves compiling and pauses out."""

import jax.numpy as jnp

from transformer_jax.run.progress import StepProgress


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Step:
    """A dispatched step whose completion the test decides (jax.Array.is_ready's contract: never waits)."""

    def __init__(self) -> None:
        self.ready = False

    def is_ready(self) -> bool:
        return self.ready


def test_the_bar_counts_completed_steps_in_order_not_dispatched_ones():
    progress = StepProgress(total=10, initial=0, enabled=True, clock=Clock(), plain=False)
    steps = [Step() for _ in range(5)]
    for step in steps[:3]:
        progress.dispatched(step)
    assert progress.bar.n == 0  # three dispatched, none finished
    steps[0].ready = steps[2].ready = True  # the third finished, but the second has not: steps finish in order
    progress.dispatched(steps[3])
    assert progress.bar.n == 1
    steps[1].ready = True
    assert progress.poll() == 2 and progress.bar.n == 3
    steps[3].ready = True
    progress.dispatched(steps[4])
    steps[4].ready = True
    progress.resume()  # after a pause, what finished during it is counted too
    assert progress.bar.n == 5


def test_a_resumed_bar_starts_at_the_checkpoint_step_and_takes_real_arrays():
    progress = StepProgress(total=100, initial=40, enabled=True, clock=Clock(), plain=False)
    arrays = [jnp.ones(()) * 2, jnp.ones(()) * 3]
    for array in arrays:
        progress.dispatched(array)
    for array in arrays:
        array.block_until_ready()
    progress.resume()
    assert progress.bar.n == 42


def test_the_rate_leaves_out_compiling_and_pauses_and_the_eta_follows_it():
    clock = Clock()
    progress = StepProgress(total=1000, initial=0, enabled=True, clock=clock, plain=False)

    def complete(count: int, seconds: float) -> None:
        steps = [Step() for _ in range(count)]
        for step in steps:
            progress.dispatched(step)
        clock.now += seconds
        for step in steps:
            step.ready = True
        progress.poll()

    complete(1, 40.0)  # the first step compiles: no rate yet, and no ETA guessed from the elapsed time
    assert progress.steps_per_second is None
    assert "<?, ?step/s" in str(progress.bar)
    for _ in range(20):
        complete(1, 0.5)
    assert abs(progress.steps_per_second - 2.0) < 1e-9
    clock.now += 300.0  # evaluating and saving
    progress.resume()
    complete(1, 0.5)
    assert abs(progress.steps_per_second - 2.0) < 1e-9
    complete(10, 5.0)  # a burst: ten steps seen finished at once (a log step's fetch) keeps the rate
    assert abs(progress.steps_per_second - 2.0) < 1e-9
    assert progress.bar.format_dict["rate"] == progress.steps_per_second
    remaining = (1000 - progress.bar.n) / 2.0
    assert f"<{int(remaining // 60):02d}:{int(remaining % 60):02d}" in str(progress.bar)
    complete(1, 1.0)  # one slow step moves the smoothed rate only part of the way (tqdm's smoothing 0.1)
    assert 1.8 < progress.steps_per_second < 2.0


def test_off_a_terminal_each_log_window_is_one_plain_line(capsys):
    """A log file gets "train step N/M | loss ... | ETA ..." lines, no carriage-return bar (as fairseq logs)."""
    clock = Clock()
    progress = StepProgress(total=100, initial=10, enabled=True, clock=clock, plain=True)
    steps = [Step() for _ in range(4)]
    for step in steps:
        progress.dispatched(step)
        step.ready = True
        clock.now += 0.5
        progress.poll()
    progress.set_postfix(loss="4.125", lr="1.00e-04", tok_s="1234")
    progress.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.count("\n") == 1, repr(err)
    assert err.startswith("train step 14/100 | loss 4.125 | lr 1.00e-04 | tok_s 1234 | 2.00 step/s | ETA 0:00:43"), err
    quiet = StepProgress(total=100, initial=0, enabled=False, plain=True)  # another process: nothing
    quiet.set_postfix(loss="1")
    assert capsys.readouterr().err == ""
