"""Prefetcher: batches in order, the state of the consumer (not of the thread), errors raised in order."""

import threading
import time

import pytest

from transformer_jax.run.prefetch import Prefetcher


class Counter:
    """An iterator of 0, 1, 2, ... with get_state(); fails at `fail_at` when given."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.position, self.fail_at = 0, fail_at

    def __next__(self) -> int:
        if self.position == self.fail_at:
            raise ValueError(f"bad record {self.position}")
        self.position += 1
        return self.position - 1

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}


def test_batches_come_in_order_and_the_state_is_the_consumers():
    counter = Counter()
    prefetcher = Prefetcher(counter, lambda batch: batch * 10, depth=3)
    assert [next(prefetcher) for _ in range(5)] == [0, 10, 20, 30, 40]
    deadline = time.time() + 10
    while counter.position < 8 and time.time() < deadline:  # the thread reads ahead, 3 batches at most queued
        time.sleep(0.01)
    time.sleep(0.3)
    # Three batches queued, and at most one more built, waiting for room: never further ahead.
    assert counter.position in (8, 9)
    assert prefetcher.state() == {"position": 5}  # what a checkpoint records: after the 5 batches consumed
    prefetcher.close()
    assert not any(thread.name == "prefetch" for thread in threading.enumerate())
    assert prefetcher.state() == {"position": 5}


def test_an_error_of_the_iterator_is_raised_after_the_batches_before_it():
    prefetcher = Prefetcher(Counter(fail_at=2), lambda batch: batch, depth=2)
    assert [next(prefetcher), next(prefetcher)] == [0, 1]
    with pytest.raises(ValueError, match="bad record 2"):
        next(prefetcher)
    assert prefetcher.state() == {"position": 2}
    prefetcher.close()


def test_the_trainer_records_the_consumed_position_with_prefetching(run_config, tmp_path):
    from transformer_jax.run import Trainer, assemble_run

    run_config.data.prefetch_batches = 2
    trainer = Trainer(assemble_run(run_config, str(tmp_path)))
    reference = trainer.data.train.get_state()
    for _ in range(3):
        trainer.update()
    assert trainer.input is not None and trainer.input_state()["position"] == reference["position"] + 3
    trainer.stop_input()
    assert trainer.input is None and trainer.data.train.get_state() == trainer.input_state()
    assert trainer.data.train.get_state()["position"] == reference["position"] + 3
    trainer.close()
