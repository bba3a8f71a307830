"""The training loop: `Trainer` trains a run that `assemble_run` (assembly.py) built, resuming.

The loop's helpers live beside it: `updates` (the `UpdateRunner` it extends: the state, batches read ahead and
placed, one update dispatched), `log_window` (train metrics and progress), `periodic_eval` (dev loss and BLEU),
`preemption`, `failures`, and the checkpoints of `transformer_jax.checkpoints` (save and resume).

`assemble_run` refuses a damaged workdir before writing anything (a file where a folder belongs, a damaged
log). A write the storage refuses (a full disk, a quota, a read-only file system) or a workdir removed
under the run stops it with one StorageError saying what is kept and how to go on; after a full disk,
the same command resumes from the newest complete checkpoint as after any other stop.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import time
from typing import Any, Callable

import jax

from transformer_jax.base import await_verdict_if_lost_peer
from transformer_jax.base import workdir as layout
from transformer_jax.base.console import say
from transformer_jax.base.files import storage_errno, storage_error, storage_remedy
from transformer_jax.checkpoints.initial import initial_params
from transformer_jax.config.schema import write_run_config
from transformer_jax.errors import ConfigError, DeviceError, StorageError
from transformer_jax.run.assembly import TrainingRun
from transformer_jax.run.failures import (attention_in_use, check_skip_streak, check_trained, device_failure,
                                          is_device_fault, kept_checkpoint, non_finite_advice)
from transformer_jax.run.log_window import LogWindow, open_window_problem
from transformer_jax.run.periodic_eval import MetricsOf, PeriodicEval
from transformer_jax.run.preemption import EvaluationAbandoned, StopAgreement, StopFlag, grace_problem
from transformer_jax.run.profile import UpdateProfile
from transformer_jax.run.setting_changes import CHANGES, describe, record_changes
from transformer_jax.run.updates import UpdateRunner
from transformer_jax.training.dev_loss import evaluate_loss
from transformer_jax.training.state import TrainState


class Trainer(UpdateRunner):
    """Trains an assembled run (`assemble_run`): `run()` trains to `num_train_steps`, resuming if checkpoints exist.
    Each update is `UpdateRunner`'s (updates.py)."""

    def __init__(self, run: TrainingRun) -> None:
        self.started = run.started  # the start-up's clock (timing.jsonl's startup_seconds)
        self.workdir, self.checkpointer = run.workdir, run.checkpointer
        self.model_config, self.schedule = run.programs.model_config, run.programs.schedule
        try:
            super().__init__(run)
            self.workdir_watch = layout.RunWatch(run.workdir)  # to tell when it vanishes under the run
        except BaseException:  # a Trainer that was not made cannot be closed: release what the run holds
            run.close()
            raise
        self.failed = False  # whether `run` raised
        self.stopped_by = ""  # what stopped training before its last step (a signal), once it has
        self.stop_signal = 0  # its number (SIGTERM's for a signal to another process): the exit status is 128 + it
        self.start_step = self.start_applied = self.step_reached = 0  # where `run` started, and the step reached
        self.must_stop: StopAgreement | None = None  # made by `run`: the stop agreement and the bound on the lead
        self.abandoned_at: int | None = None  # the step whose dev evaluation a stop abandoned
        self.write_seconds: float | None = None  # the first save of this start, from its call to its files on disk
        self.grace_checked = False  # whether the stop was checked against training.stop_grace_seconds

    def restore_latest(self) -> tuple[int, dict[str, Any]]:
        """Resume from the newest checkpoint that restores intact (damaged newer ones are reported and set aside).

        Returns the step to continue from and the checkpoint's meta record ({} for a fresh start): its
        "open_window" holds the per-step metrics of the log window that was open when it was saved, so the next
        log line covers the same steps as without a stop, and its "metrics" the dev metrics saved with it.
        """
        restored = self.checkpointer.restore_latest(self.programs.abstract_state, self._record_problem)
        if restored is None:
            if self.config.training.init_from:  # fine-tuning: a fresh start from another run's parameters
                source = self.config.training.init_from
                params, step = initial_params(source, self.state.params, self.model_config.scan_layers)
                self.state = self.state.replace(params=params)
                say(f"starting from the parameters of {source} (its step {step})")
            return 0, {}
        step, self.state, data_state, meta = restored
        self.stop_input()  # batches read ahead belong to the position being replaced
        self.data.train.set_state(data_state)
        say(f"resumed from {self.checkpointer.directory}/{step}")
        return step, meta

    def _record_problem(self, data_state: dict[str, Any], meta: dict[str, Any]) -> str | None:
        """What is malformed in a checkpoint's data position or open log window (a damaged checkpoint); None: fine."""
        problem = self.data.train.state_problem(data_state)
        if problem:
            return f"its data-iterator record is malformed ({problem})"
        problem = open_window_problem(meta.get("open_window", []))
        return f"its meta record is malformed ({problem})" if problem else None

    def dev_loss(self, params: Any = None, interrupt: Callable[[], None] | None = None) -> dict[str, float]:
        """Loss, NLL, perplexity and token accuracy on the whole dev set (of the current state by default);
        `interrupt` is called between batches (see evaluate_loss)."""
        params = self.state.params if params is None else params
        self.running = "dev_loss_step"
        return evaluate_loss(self.programs.dev_loss_step, params, self.data.dev.encoded,
                             self.config.data.eval_batch_size, self.mesh, row_width=self.data.train.row_width,
                             interrupt=interrupt)

    def save(self, step: int, window: LogWindow, metrics: dict[str, float] | None = None) -> None:
        """Checkpoint the state, the data position, the open log window and what rebuilds the run; the seconds
        the loop stood still for it (Orbax writes the files in the background) go to timing.jsonl as
        `checkpoint_stall_seconds`.

        Nothing is written while updates are being skipped for a non-finite loss: finite parameters
        that give a non-finite loss (e.g. after a too-large learning rate) must not push the last good
        checkpoint out of the kept ones.
        """
        if step == self.last_saved_step:
            return
        # The first save of this start is waited for and timed (what a stop's save costs), from the state's being
        # computed: not the updates still in flight.
        first = self.write_seconds is None
        if first:
            jax.block_until_ready(self.state)
        started = time.perf_counter()
        if self._save(step, window.step_metrics, metrics):
            if first:
                self.checkpointer.wait()
                self.write_seconds = time.perf_counter() - started
                window.log.write_timing(step, {"checkpoint_write_seconds": self.write_seconds})
                self._check_grace(step, window)
            window.log.write_timing(step, {"checkpoint_stall_seconds": time.perf_counter() - started})

    def _save(self, step: int, window: list, metrics: dict[str, float] | None) -> bool:
        """Checkpoint (see save); returns whether a checkpoint was written."""
        self._check_workdir()  # Orbax would make a vanished workdir anew for the checkpoint
        if int(jax.device_get(self.state.consecutive_skipped)):
            logging.error("step %d: the last update was skipped (non-finite loss or gradient); "
                          "checkpoint not written", step)
            return False
        self.last_saved_step = step
        open_window = [{k: float(v) for k, v in m.items()} for m in jax.device_get(window)]
        meta = {"model_config": dataclasses.asdict(self.model_config), "open_window": open_window}
        return self.checkpointer.save(step, self.state, self.input_state(), meta, metrics)  # logs a refusal

    def newest_checkpoint(self) -> int | None:
        """The newest checkpoint on disk once pending saves are written (None: there is none)."""
        self.checkpointer.wait()
        return self.checkpointer.latest_step()

    def run(self, dev_bleu: MetricsOf | None = None) -> TrainState:
        """Train to `num_train_steps`, resuming where the workdir's checkpoints left off.

        Raises StorageError when the storage refuses a write or the workdir vanishes (see the module docstring), and
        DeviceError when a program fails on the device (`device_failure`).
        """
        try:
            return self._run(dev_bleu)
        except BaseException as error:
            self.failed = True
            await_verdict_if_lost_peer(error)  # a collective a dead process broke: the peer watch's line, not ours
            if is_device_fault(error):
                raise self._device_failure(error) from None
            failure = self._storage_failure(error) if isinstance(error, Exception) else None
            if failure is None:
                raise
            raise failure from None

    def _run(self, dev_bleu: MetricsOf | None) -> TrainState:
        training = self.config.training
        say(f"run directory {self.workdir}: metrics.jsonl, checkpoints/, tensorboard/ (training to step "
            f"{training.num_train_steps})")
        began = time.perf_counter()
        self.running = "restoring the newest checkpoint"
        start, resumed = self.restore_latest()
        self.start_step = self.step_reached = start  # the optimizer's count at the start: the updates applied
        self.start_applied = start - int(jax.device_get(self.state.skipped_updates))
        if start > training.num_train_steps:  # before config.json is rewritten with the smaller value
            raise ConfigError(
                f"training.num_train_steps={training.num_train_steps} is below step {start}, where the run in "
                f"{self.workdir} already is; pass --config.training.num_train_steps={start} or more to go on, "
                "or use a new workdir"
            )
        restored = time.perf_counter()
        self.last_saved_step = start
        if start < training.num_train_steps:
            self.running = "compiling the train step"
            self.compile_steps()
        compiled = time.perf_counter()
        is_writer = jax.process_index() == 0
        if is_writer:
            if start > 0 and (changes := record_changes(self.workdir, start, self.config)):
                say(f"resuming at step {start} with changed settings, recorded in {self.workdir}/{CHANGES}: "
                    f"{describe(changes)}")
            write_run_config(self.config, self.workdir)
        self.workdir_watch.note_names()
        window = LogWindow(self.workdir, self.schedule, start, training.num_train_steps,
                           resumed.get("open_window", []), is_writer,
                           wandb_project=training.wandb_project, run_config=self.config.to_dict())
        if start < training.num_train_steps:  # where the start (or the resume) went, up to the first update
            window.log.write_timing(start, {"startup_seconds": time.perf_counter() - self.started,
                                            "restore_seconds": restored - began,
                                            "compile_seconds": compiled - restored})
        evaluate = PeriodicEval(training.eval_every, training.bleu_every, self.dev_loss, self._named_search(dev_bleu))
        self.profile = UpdateProfile(layout.run_path(self.workdir, layout.PROFILE), start + training.profile_skip_steps,
                                     training.profile_steps, enabled=is_writer)
        stop = StopFlag(step=start)
        self.must_stop = StopAgreement(stop, self.mesh, training.max_updates_in_flight)
        # A checkpoint saved at a step whose evaluation was due, without its metrics: a stop abandoned that evaluation
        # (a checkpoint of such a step otherwise carries them; one between evaluations is never owed any).
        owed = start > 0 and evaluate.due(start) and not resumed.get("metrics")
        stop.install()
        try:
            step = self._train(start, window, evaluate, stop, owed)
        except BaseException:
            self._wind_down(stop, window, quietly=True)
            raise
        self._wind_down(stop, window, quietly=False)
        check_trained(self.state, step, self.mesh, self.newest_checkpoint, self.non_finite_advice)
        return self.state

    def _train(self, start: int, window: LogWindow, evaluate: PeriodicEval, stop: StopFlag, owed: bool) -> int:
        """The steps from `start` on, logged, evaluated and saved; returns the step reached (early on a signal).
        `owed`: the evaluation due at `start` is done first (a stop abandoned it)."""
        training = self.config.training
        stopping = owed and self._evaluate(start, window, evaluate)[1]
        step = start
        while step < training.num_train_steps and not stopping:
            with self.profile.update(step, lambda: self.state):
                metrics = self.update()
                window.add(metrics, *self.step_host)
            step += 1
            self.step_reached = stop.step = step
            # At most max_updates_in_flight updates unfinished from here; the same answer on every process.
            stopping = self.must_stop.after_update(metrics["loss"])
            window.waited(self.must_stop.take_wait())
            closes_window = step % training.log_every == 0 or step == training.num_train_steps
            if closes_window:
                self._check_workdir()
                window.close(step, self.state.skipped_updates)
                check_skip_streak(self.state, training.max_skipped_updates, self.newest_checkpoint,
                                  self.non_finite_advice)
                self._check_grace(step, window)
            if stopping:  # an evaluation due here is left to the restart (the checkpoint has no metrics)
                self.abandoned_at = step if evaluate.due(step) else None
                break
            results, stopping = self._evaluate(step, window, evaluate)
            # training.checkpoint_every alone decides the checkpoints (and the last step has one); an evaluation of
            # the same step goes with its checkpoint, whose metrics rank it among the best (checkpoints/manager.py).
            saves = not stopping and (step % training.checkpoint_every == 0 or step == training.num_train_steps)
            if saves:
                self.save(step, window, results)
            if closes_window:
                window.restart_clock()  # evaluating and saving are not training time
            if closes_window or saves or results:
                window.resume_progress()
        # A signal after the last step's check, agreed like any other: the run stops instead of going on to score.
        stopping = stopping or self.must_stop.between_batches()
        if stopping:
            stop.note_arrival()  # where another process's signal stopped this one: known here now
            self.stopped_by = f"signal {stop.signal_number}" if stop.raised else "a signal to another process"
            self.stop_signal = int(stop.signal_number or signal.SIGTERM)
        self.save(step, window)
        return step

    def _evaluate(self, step: int, window: LogWindow, evaluate: PeriodicEval) -> tuple[dict[str, float] | None, bool]:
        """The dev metrics due at `step` (None: none is), logged; and whether a stop abandoned them (then nothing
        is logged, and the run's checkpoint of `step` is saved without them: the restart evaluates it)."""
        started = time.perf_counter()
        try:
            results = evaluate(step, self.state.params, window.log, self._abandon_if_stopping)
        except EvaluationAbandoned:
            self.abandoned_at = step
            return None, True
        if results:
            window.log.write_timing(step, {"eval_seconds": time.perf_counter() - started})
        return results, False

    def _abandon_if_stopping(self) -> None:
        """Between an evaluation's batches: raise EvaluationAbandoned when the run stops (the same on every
        process)."""
        if self.must_stop.between_batches():
            raise EvaluationAbandoned()

    def _check_grace(self, step: int, window: LogWindow) -> None:
        """Once the first save is timed and a window has closed: one line when a stop cannot fit
        training.stop_grace_seconds (`grace_problem`), and the estimate in timing.jsonl."""
        if self.grace_checked or self.write_seconds is None or window.seconds_per_step is None:
            return
        self.grace_checked = True
        training = self.config.training
        estimate, problem = grace_problem(training.stop_grace_seconds, training.max_updates_in_flight,
                                          jax.process_count(), window.seconds_per_step, self.write_seconds,
                                          self.checkpointer.directory)
        window.log.write_timing(step, {"stop_estimate_seconds": estimate})
        if problem:
            say(problem)

    def non_finite_advice(self) -> str:
        """What to change for updates skipped as non-finite, from what this start applied (`non_finite_advice`)."""
        applied = int(jax.device_get(self.state.step)) - int(jax.device_get(self.state.skipped_updates))
        return non_finite_advice(self.config.training, self.schedule, self.start_applied, applied, self.start_step,
                                 attention_in_use(self.model_config, self.mesh), self.model_config.dtype)

    def _named_search(self, dev_bleu: MetricsOf | None) -> MetricsOf | None:
        """`dev_bleu`, recorded as the program running while it runs (a device failure names it)."""
        if dev_bleu is None:
            return None

        def named(params: Any, interrupt: Callable[[], None]) -> dict[str, float]:
            self.running = "the dev BLEU search"
            return dev_bleu(params, interrupt)
        return named

    def _device_failure(self, error: Exception) -> DeviceError:
        """The one line for a program that failed on the device, once pending saves are settled (what it says is
        kept is on disk; a save of the failed state is never begun: `_save` reads the state first)."""
        self._settle_saves()
        program = self.running + (f" (update {self.step_reached + 1})" if self.running in (
            "train_step", "micro_gradients", "apply_gradients") else f" (at step {self.step_reached})")
        return device_failure(error, program, attention_in_use(self.model_config, self.mesh), self.config,
                              self.checkpointer.latest_step())

    def _wind_down(self, stop: StopFlag, window: LogWindow, quietly: bool) -> None:
        """Stop reading ahead, finish pending saves, report a stop, close the log, then give the signals back.

        `quietly` when training failed: a failure here (the same full disk) would only hide that first one.
        """
        try:
            self.profile.stop()
            self.stop_input()
            report = (lambda: None) if quietly else (lambda: self._report_stop(stop, window))
            for finish in (self.checkpointer.wait, report, window.finish):
                try:
                    finish()
                except Exception:
                    if not quietly:
                        raise
        finally:
            stop.uninstall()  # after the saves: a signal while they are written does not cut them short
            if not quietly and stop.raised and not self.stopped_by and jax.process_count() == 1:
                os.kill(os.getpid(), stop.signal_number)  # it came as the run ended: the command's handler acts on it

    def _report_stop(self, stop: StopFlag, window: LogWindow) -> None:
        """After a stop's checkpoint is on disk: the stop line (every process) and, in timing.jsonl, the seconds
        from the signal to it (`stop_seconds`) and the step the signal arrived at (`signal_step`)."""
        if not self.stopped_by:
            return
        seconds = time.perf_counter() - stop.arrived
        step, newest = self.step_reached, self.checkpointer.latest_step()
        window.log.write_timing(step, {"stop_seconds": seconds, "signal_step": stop.arrived_step})
        when = ("the signal, which arrived at step" if stop.raised else "the processes agreed to stop, at step")
        kept = (f"checkpoint {newest} saved {seconds:.1f} s after {when} {stop.arrived_step}" if newest == step
                else kept_checkpoint(newest))
        abandoned = (f"; its dev evaluation of step {self.abandoned_at} was abandoned and is done when the run resumes"
                     if self.abandoned_at is not None else "")
        line = f"stopped by {self.stopped_by} at step {step}: {kept}{abandoned}; the same command resumes the run"
        say(line) if jax.process_index() == 0 else logging.warning(line)  # one line from every process

    def _check_workdir(self) -> None:
        """Raise FileNotFoundError when the workdir the run started in, or what it held then, is gone."""
        if self.workdir_watch.vanished():
            raise FileNotFoundError(errno.ENOENT, "the workdir vanished", self.workdir)

    def _storage_failure(self, error: Exception) -> StorageError | None:
        """The one line for `error` when the storage refused a write or the workdir vanished; None: a bug (or a
        user error of its own), raised as it is."""
        vanished = self.workdir_watch.vanished(patience=3.0)  # `error` may be a write that found its file gone
        if vanished:
            self._settle_saves()
            return StorageError(
                f"{vanished} vanished while the run was writing it (deleted or unmounted); restore it and run the "
                "same command again to resume, or remove the workdir and run the same command to start over"
            )
        if isinstance(error, StorageError):
            return error  # the checkpointer's: it names the step and what is kept
        if storage_errno(error) is None:
            return None
        self._settle_saves()  # so what the message says is kept is on disk
        return storage_error(error, "writing", self.checkpointer.resume_advice(storage_remedy(error)))

    def _settle_saves(self) -> None:
        """Let pending checkpoint saves finish; one that fails is not reported: the failure at hand is."""
        try:
            self.checkpointer.wait()
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    def close(self) -> None:
        """Stop reading ahead, finish pending checkpoint writes and release the checkpoint manager and the workdir.

        After a failed `run`, what the checkpointer raises here is left out: it would hide that failure.
        """
        self.stop_input()
        self.workdir_watch.close()
        try:
            self.checkpointer.close()
        except Exception:
            if not self.failed:
                raise
