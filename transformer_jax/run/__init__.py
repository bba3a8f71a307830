"""A training run: assembled from a config and a workdir, trained, logged and evaluated on a schedule.

`memory` (will a state or program fit the devices) -> `programs` (the run builder: a run's state layout and
jitted programs on its mesh, shared by the Trainer, the preflight and the benchmarks) ->
`metrics_log`, `progress`, `log_window` (metrics.jsonl, TensorBoard, the log line and progress bar) ->
`periodic_eval` (dev loss and BLEU on a step schedule) -> `preemption`
(StopFlag; StopAgreement: the stop agreed by every process, and the bound on the host's lead; the stop's grace
check) -> `failures` (non-finite updates, device faults: the line saying what to change) -> `prefetch` (batches built ahead in the background) -> `profile` (a jax.profiler
trace of a few updates) -> `trace_summary` (what the trace says per update) -> `assembly` (`assemble_run`:
the config and workdir checked, then mesh, data, programs and checkpointer) -> `updates` (`UpdateRunner`: the
state, batches read ahead and placed on the mesh, one update dispatched) -> `loop` (`Trainer`: trains an assembled
run, resuming from `transformer_jax.checkpoints`).

Needs the `train` extra (ml_collections, Orbax, the data pipeline, tqdm); the paper's loss, schedule, state and
step, which need only the base install, are in `transformer_jax.training` (with the dev-loss sums the score
command shares); the logs read back and TensorBoard's event files are in `transformer_jax.base`. Nothing that
translates (decoding/, evaluation/, export/) imports this folder.
"""

from transformer_jax.run.assembly import TrainingRun, assemble_run
from transformer_jax.run.log_window import LogWindow
from transformer_jax.run.failures import check_trained
from transformer_jax.run.loop import Trainer
from transformer_jax.run.metrics_log import MetricsLog
from transformer_jax.run.periodic_eval import PeriodicEval
from transformer_jax.run.preemption import StopAgreement, StopFlag
from transformer_jax.run.prefetch import Prefetcher
from transformer_jax.run.profile import UpdateProfile
from transformer_jax.run.programs import RunPrograms, build_run, build_run_for
from transformer_jax.run.trace_summary import TraceSummary, newest_trace, read_trace, summarize_trace

__all__ = [
    "LogWindow", "MetricsLog", "PeriodicEval", "Prefetcher", "RunPrograms", "StopAgreement", "StopFlag", "TraceSummary",
    "Trainer", "TrainingRun", "UpdateProfile", "assemble_run", "build_run", "build_run_for", "check_trained",
    "newest_trace", "read_trace", "summarize_trace",
]
