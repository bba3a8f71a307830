"""The training loop: sharded state, resume, logging, dev evaluation, checkpoints."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from transformer_jax.data.pipeline import RunData, prepare_data
from transformer_jax.errors import TrainingError
from transformer_jax.evaluation.perplexity import evaluate_loss
from transformer_jax.model.transformer import Transformer
from transformer_jax.run.config_schema import (
    check_run_config,
    model_config,
    write_run_config,
)
from transformer_jax.run.sharding import (
    abstract_with_shardings,
    batch_sharding,
    global_batch,
    init_sharded,
    make_mesh,
)
from transformer_jax.training.checkpoints import Checkpointer, best_metric_for
from transformer_jax.training.metrics_log import MetricsLog
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.preemption import StopFlag
from transformer_jax.training.state import TrainState, create_train_state
from transformer_jax.training.step import (
    add_trees,
    apply_gradients,
    compute_gradients,
    eval_step,
    train_step,
)


class Trainer:
    """Holds what one run needs; `run()` trains to `num_train_steps` (resuming if checkpoints exist)."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, data: RunData | None = None) -> None:
        check_run_config(config)
        self.config, self.workdir = config, workdir
        self.mesh = make_mesh(config.mesh.data, config.mesh.fsdp)
        self.data = data or prepare_data(
            config, workdir, row_multiple=self.mesh.size,
            process_index=jax.process_index(), process_count=jax.process_count(),
        )
        self.model_config = model_config(config, self.data.tokenizer.vocab_size)
        self.model = Transformer(self.model_config)
        training = config.training
        self.schedule = paper_learning_rate(
            self.model_config.d_model, training.warmup_steps, training.learning_rate_scale
        )
        optimizer = paper_optimizer(
            self.schedule, training.adam_b1, training.adam_b2, training.adam_eps,
            training.grad_clip_norm or None,
        )
        self.state, self.shardings = init_sharded(
            lambda: create_train_state(self.model, optimizer, training.seed), self.mesh
        )
        self.checkpointer = Checkpointer(
            os.path.join(workdir, "checkpoints"), training.keep_checkpoints,
            *best_metric_for(training.bleu_every),
        )
        self._jit_steps()

    def _jit_steps(self) -> None:
        smoothing = self.config.training.label_smoothing
        batch = batch_sharding(self.mesh)
        self.train_step = jax.jit(
            lambda state, b: train_step(state, b, smoothing),
            in_shardings=(self.shardings, batch), out_shardings=(self.shardings, None), donate_argnums=0,
        )
        self.micro_gradients = jax.jit(
            lambda state, b, i: compute_gradients(state, b, smoothing, i),
            in_shardings=(self.shardings, batch, None), out_shardings=(self.shardings.params, None),
        )
        self.apply_gradients = jax.jit(
            apply_gradients, in_shardings=(self.shardings, self.shardings.params, None),
            out_shardings=(self.shardings, None), donate_argnums=0,
        )
        self.add_trees = jax.jit(add_trees, donate_argnums=0)
        # Micro-step indices live on the devices once, so update() passes no Python scalars to jit.
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.micro_steps = [jax.device_put(np.int32(i), replicated)
                            for i in range(self.config.training.accumulation_steps)]
        self.eval_step = jax.jit(
            lambda params, b: eval_step(params, self.model.apply, b, smoothing),
        )

    def restore_latest(self) -> tuple[int, list[dict[str, Any]]]:
        """Resume from the newest checkpoint that restores intact (damaged newer ones are reported and set aside).

        Returns the step to continue from and the per-step metrics of the log window that was open
        when the checkpoint was saved, so the next log line covers the same steps as without a stop.
        """
        abstract = abstract_with_shardings(self.state, self.shardings)
        restored = self.checkpointer.restore_latest(abstract)
        if restored is None:
            return 0, []
        step, self.state, data_state, meta = restored
        self.data.train.set_state(data_state)
        logging.info("resumed from %s/%d", self.checkpointer.directory, step)
        return step, meta.get("open_window", [])

    def update(self) -> dict[str, jax.Array]:
        """One optimizer update from `accumulation_steps` micro-batches; returns its metrics (on device).

        Runs under a transfer guard: the batches' copy to the devices is the one transfer of a step;
        anything else crossing between host and device (a Python scalar or NumPy array passed to a
        jitted step, a value read back) raises an error.
        """
        accumulation = self.config.training.accumulation_steps
        with jax.transfer_guard("disallow"):
            batches = [self._next_global_batch() for _ in range(accumulation)]
            if accumulation == 1:
                self.state, metrics = self.train_step(self.state, batches[0])
                return metrics
            grads, sums = self.micro_gradients(self.state, batches[0], self.micro_steps[0])
            for index, batch in enumerate(batches[1:], start=1):
                more_grads, more_sums = self.micro_gradients(self.state, batch, self.micro_steps[index])
                grads, sums = self.add_trees(grads, more_grads), self.add_trees(sums, more_sums)
            self.state, metrics = self.apply_gradients(self.state, grads, sums)
            return metrics

    def _next_global_batch(self) -> dict[str, jax.Array]:
        """The next batch, placed on the mesh: the intended host-to-device copy, allowed by name.

        (With several processes the placement uses make_array_from_process_local_data, which the
        transfer guard counts as implicit.)
        """
        local = next(self.data.train)
        with jax.transfer_guard_host_to_device("allow"):
            return global_batch(local, self.mesh)

    def dev_loss(self) -> dict[str, float]:
        """Loss, NLL, perplexity and token accuracy on the whole dev set."""
        return evaluate_loss(self.eval_step, self.state.params, self.data.dev.encoded, self.config.data.eval_batch_size)

    def save(self, step: int, window: list, metrics: dict[str, float] | None = None) -> None:
        """Checkpoint the state, the data position, the open log window and what rebuilds the run.

        Nothing is written while updates are being skipped for a non-finite loss: finite parameters
        that give a non-finite loss (e.g. after a too-large learning rate) must not push the last good
        checkpoint out of the kept ones.
        """
        if step == self.last_saved_step:
            return
        if int(jax.device_get(self.state.consecutive_skipped)):
            logging.error("step %d: the last update was skipped (non-finite loss or gradient); "
                          "checkpoint not written", step)
            return
        self.last_saved_step = step
        open_window = [{k: float(v) for k, v in m.items()} for m in jax.device_get(window)]
        meta = {"model_config": dataclasses.asdict(self.model_config), "open_window": open_window}
        if not self.checkpointer.save(step, self.state, self.data.train.get_state(), meta, metrics):
            logging.error("parameters at step %d are not finite: checkpoint not written", step)

    def run(self, dev_bleu: Callable[[Any], dict[str, float]] | None = None) -> TrainState:
        """Train to `num_train_steps`, resuming where the workdir's checkpoints left off."""
        training = self.config.training
        start, window = self.restore_latest()
        self.last_saved_step = start
        is_writer = jax.process_index() == 0
        if is_writer:
            write_run_config(self.config, self.workdir)
        log = MetricsLog(self.workdir, enabled=is_writer, resume_step=start)
        stop = StopFlag()
        stop.install()
        window_start = time.perf_counter()
        progress = tqdm(total=training.num_train_steps, initial=start, disable=not is_writer,
                        desc="train", unit="step", dynamic_ncols=True)
        step = start
        try:
            while step < training.num_train_steps:
                window.append(self.update())
                step += 1
                progress.update(1)
                closes_window = step % training.log_every == 0 or step == training.num_train_steps
                if closes_window:
                    self._log_train(step, window, window_start, log, progress)
                    window = []
                metrics = self._evaluate(step, log, dev_bleu)
                if step % training.checkpoint_every == 0 or metrics:
                    self.save(step, window, metrics)
                if closes_window:
                    window_start = time.perf_counter()  # evaluating and saving are not training time
                # Several processes must agree on the stop step: they compare flags at log steps only.
                if (jax.process_count() == 1 or closes_window) and stop.agreed():
                    self.save(step, window)
                    logging.warning("stopped by signal %s at step %d; checkpoint saved", stop.signal_number, step)
                    break
            self.save(step, window)
        finally:
            stop.uninstall()
            progress.close()
            self.checkpointer.wait()
            log.close()
        return self.state

    def close(self) -> None:
        """Finish pending checkpoint writes and release the checkpoint manager."""
        self.checkpointer.close()

    def _log_train(self, step: int, window: list, window_start: float, log: MetricsLog, progress: tqdm) -> None:
        fetched = jax.device_get(window)  # waits for the window's steps to finish
        timing = window_timing(fetched, time.perf_counter() - window_start)
        summary = summarize_window(fetched)
        # Optax counts only applied updates: skipped ones did not advance the schedule.
        skipped = int(jax.device_get(self.state.skipped_updates))
        summary["learning_rate"] = float(jax.device_get(self.schedule(step - 1 - skipped)))
        log.write(step, "train", summary)
        log.write_timing(step, timing)
        progress.set_postfix(loss=f"{summary['loss']:.3f}", lr=f"{summary['learning_rate']:.2e}",
                             tok_s=f"{timing['tokens_per_second']:.0f}")
        self._check_skipped()

    def _evaluate(self, step: int, log: MetricsLog, dev_bleu: Callable | None) -> dict[str, float] | None:
        training = self.config.training
        metrics: dict[str, float] = {}
        if training.eval_every and step % training.eval_every == 0:
            metrics.update({f"dev_{k}": v for k, v in self.dev_loss().items()})
        if dev_bleu is not None and training.bleu_every and step % training.bleu_every == 0:
            metrics.update({f"dev_{k}": v for k, v in dev_bleu(self.state.params).items()})
        if not metrics:
            return None
        log.write(step, "dev", {k.removeprefix("dev_"): v for k, v in metrics.items()})
        return metrics

    def _check_skipped(self) -> None:
        streak = int(jax.device_get(self.state.longest_skip_streak))
        if streak >= self.config.training.max_skipped_updates:
            raise TrainingError(
                f"{streak} updates in a row had a non-finite loss or gradient and were skipped; "
                "lower training.learning_rate_scale or set training.grad_clip_norm (the last good "
                "checkpoint is kept)"
            )


def summarize_window(fetched: list[dict[str, Any]]) -> dict[str, float]:
    """Token-weighted means of the (fetched) per-step metrics since the last log (no wall-clock figures)."""
    # Python floats throughout, so a window restored from a checkpoint sums exactly like a live one.
    fetched = [{key: float(value) for key, value in m.items()} for m in fetched]
    tokens = np.array([m["tokens"] for m in fetched])
    total = max(tokens.sum(), 1.0)
    mean = lambda key: float(np.sum([m[key] * t for m, t in zip(fetched, tokens)]) / total)
    nll = mean("nll")
    return {
        "loss": mean("loss"),
        "nll": nll,
        "perplexity": float(np.exp(min(nll, 50.0))),
        "accuracy": mean("accuracy"),
        "grad_norm": float(np.mean([m["grad_norm"] for m in fetched])),
        "skipped_updates": float(np.sum([m["update_skipped"] for m in fetched])),
    }


def window_timing(fetched: list[dict[str, Any]], seconds: float) -> dict[str, float]:
    """Throughput of the log window: target tokens per second and seconds per step (wall clock)."""
    tokens = float(np.sum([float(m["tokens"]) for m in fetched]))
    return {"tokens_per_second": tokens / max(seconds, 1e-9), "seconds_per_step": seconds / max(len(fetched), 1)}
