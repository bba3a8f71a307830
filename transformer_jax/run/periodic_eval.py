"""Dev-set evaluation during training: loss every `eval_every` steps, BLEU every `bleu_every` steps."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from transformer_jax.base.console import say
from transformer_jax.run.metrics_log import MetricsLog

Interrupt = Callable[[], None]  # called between an evaluation's batches; raises to abandon it (a stop)
MetricsOf = Callable[[Any, Interrupt], dict[str, float]]  # (parameters, interrupt) -> metrics of the dev set
_SHOWN = (("loss", 4), ("perplexity", 2), ("accuracy", 4), ("bleu", 2), ("chrf", 2))  # on the console, with digits


def _never() -> None:
    """An interrupt that never abandons."""


@dataclasses.dataclass(frozen=True)
class PeriodicEval:
    """Which dev metrics are due at a step, computed and logged (0 or no `dev_bleu`: never)."""

    eval_every: int
    bleu_every: int
    dev_loss: MetricsOf
    dev_bleu: MetricsOf | None = None

    def due(self, step: int) -> bool:
        """Whether some dev metric is due at `step`."""
        loss = bool(self.eval_every) and step % self.eval_every == 0
        bleu = self.dev_bleu is not None and bool(self.bleu_every) and step % self.bleu_every == 0
        return loss or bleu

    def __call__(self, step: int, params: Any, log: MetricsLog, interrupt: Interrupt = _never
                 ) -> dict[str, float] | None:
        """The metrics due at `step` as {"dev_loss": ..., "dev_bleu": ...}, logged as split "dev"; None if none is.

        `interrupt` is passed to each evaluation, which calls it between batches: what it raises abandons the
        evaluation, and nothing of it is logged.
        """
        metrics: dict[str, float] = {}
        if self.eval_every and step % self.eval_every == 0:
            metrics.update({f"dev_{k}": v for k, v in self.dev_loss(params, interrupt).items()})
        if self.dev_bleu is not None and self.bleu_every and step % self.bleu_every == 0:
            metrics.update({f"dev_{k}": v for k, v in self.dev_bleu(params, interrupt).items()})
        if not metrics:
            return None
        dev = {k.removeprefix("dev_"): v for k, v in metrics.items()}
        log.write(step, "dev", dev)
        shown = [f"{name} {dev[name]:.{digits}f}" for name, digits in _SHOWN if name in dev]
        say(f"step {step} dev: " + ", ".join(shown))
        return metrics
