"""Dev-set evaluation during training: loss every `eval_every` steps, BLEU every `bleu_every` steps."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from transformer_jax.base.console import say
from transformer_jax.run.metrics_log import MetricsLog

MetricsOf = Callable[[Any], dict[str, float]]  # parameters -> metrics of the dev set
_SHOWN = (("loss", 4), ("perplexity", 2), ("accuracy", 4), ("bleu", 2), ("chrf", 2))  # on the console, with digits


@dataclasses.dataclass(frozen=True)
class PeriodicEval:
    """Which dev metrics are due at a step, computed and logged (0 or no `dev_bleu`: never)."""

    eval_every: int
    bleu_every: int
    dev_loss: MetricsOf
    dev_bleu: MetricsOf | None = None

    def __call__(self, step: int, params: Any, log: MetricsLog) -> dict[str, float] | None:
        """The metrics due at `step` as {"dev_loss": ..., "dev_bleu": ...}, logged as split "dev"; None if none is."""
        metrics: dict[str, float] = {}
        if self.eval_every and step % self.eval_every == 0:
            metrics.update({f"dev_{k}": v for k, v in self.dev_loss(params).items()})
        if self.dev_bleu is not None and self.bleu_every and step % self.bleu_every == 0:
            metrics.update({f"dev_{k}": v for k, v in self.dev_bleu(params).items()})
        if not metrics:
            return None
        dev = {k.removeprefix("dev_"): v for k, v in metrics.items()}
        log.write(step, "dev", dev)
        shown = [f"{name} {dev[name]:.{digits}f}" for name, digits in _SHOWN if name in dev]
        say(f"step {step} dev: " + ", ".join(shown))
        return metrics
