"""Periodic dev evaluation: loss and BLEU each on their own step schedule, logged as split "dev"; an evaluation that
its interrupt abandons logs nothing."""

import pytest

from transformer_jax.base.log_records import read_metrics
from transformer_jax.run.metrics_log import MetricsLog
from transformer_jax.run.periodic_eval import PeriodicEval
from transformer_jax.run.preemption import EvaluationAbandoned


def test_each_metric_is_computed_and_logged_only_at_its_steps(tmp_path):
    evaluate = PeriodicEval(eval_every=2, bleu_every=3, dev_loss=lambda params, interrupt: {"loss": params * 1.0},
                            dev_bleu=lambda params, interrupt: {"bleu": params * 10.0})
    log = MetricsLog(str(tmp_path))
    due = {step: evaluate(step, 0.5, log) for step in range(1, 7)}
    log.close()
    assert due == {1: None, 2: {"dev_loss": 0.5}, 3: {"dev_bleu": 5.0}, 4: {"dev_loss": 0.5}, 5: None,
                   6: {"dev_loss": 0.5, "dev_bleu": 5.0}}
    assert [step for step in range(1, 7) if evaluate.due(step)] == [2, 3, 4, 6]
    assert [(r["step"], sorted(r)) for r in read_metrics(str(tmp_path))] == [
        (2, ["loss", "split", "step"]), (3, ["bleu", "split", "step"]), (4, ["loss", "split", "step"]),
        (6, ["bleu", "loss", "split", "step"]),
    ]


def test_zero_or_a_missing_bleu_function_turns_an_evaluation_off(tmp_path):
    log = MetricsLog(str(tmp_path), enabled=False)
    never_bleu = PeriodicEval(eval_every=0, bleu_every=1, dev_loss=lambda params, interrupt: {"loss": 1.0})
    never_loss = PeriodicEval(eval_every=0, bleu_every=0, dev_loss=lambda params, interrupt: {"loss": 1.0},
                              dev_bleu=lambda params, interrupt: {"bleu": 1.0})
    assert all(e(step, None, log) is None for e in (never_bleu, never_loss) for step in range(1, 5))
    assert not any(e.due(step) for e in (never_bleu, never_loss) for step in range(1, 5))


def test_an_abandoned_evaluation_logs_nothing_not_even_the_metrics_done_before(tmp_path):
    """The loss is done, then the BLEU's interrupt abandons it: the step's record is not written half."""
    def bleu(params, interrupt):
        interrupt()
        return {"bleu": 1.0}

    def stop():
        raise EvaluationAbandoned()

    evaluate = PeriodicEval(eval_every=1, bleu_every=1, dev_loss=lambda params, interrupt: {"loss": 1.0},
                            dev_bleu=bleu)
    log = MetricsLog(str(tmp_path))
    with pytest.raises(EvaluationAbandoned):
        evaluate(1, None, log, stop)
    assert evaluate(2, None, log) == {"dev_loss": 1.0, "dev_bleu": 1.0}  # no interrupt: never abandoned
    log.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [2]
