"""The flags the commands that use a trained run share: which run and checkpoint, how to join a pod, how to search.

Each command module calls the `define_*` functions it needs, once, at import: absl's flags are global, so a
command defines only its own, and `transformer-jax COMMAND --help` lists exactly them (they are registered as
the calling module's key flags).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from absl import flags

from transformer_jax.cli.cluster import ClusterFlags, define_cluster_flags
from transformer_jax.cli.flag_parsing import refuse_blank, register_key_flags


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """--workdir and --checkpoint, and (where the command runs on a pod) the cluster flags and --cpu_devices."""

    workdir: flags.FlagHolder
    checkpoint: flags.FlagHolder
    cluster: ClusterFlags | None
    cpu_devices: flags.FlagHolder | None

    @property
    def lead(self) -> bool:
        """Whether this process reports (prints, writes files): process 0 of a multi-process run, else the one."""
        import jax

        return self.cluster is None or not self.cluster.multihost.value or jax.process_index() == 0

    def say(self, *args: Any, **kwargs: Any) -> None:
        """print(), from the reporting process only."""
        if self.lead:
            print(*args, **kwargs)

    def start(self) -> None:
        """Before any work: the compilation cache, the CPU devices, the multi-process run, JAX's backends."""
        from transformer_jax.base import set_cpu_devices
        from transformer_jax.cli.cluster import start_backends

        if self.cluster is None:
            start_backends()
            return
        self.cluster.use_compilation_cache(self.workdir.value)
        if self.cpu_devices is not None:
            set_cpu_devices(self.cpu_devices.value)  # before JAX starts its backends
        self.cluster.join()

    @contextlib.contextmanager
    def opened(self) -> Iterator[Any]:
        """The run of --workdir (checkpoints.Run), its checkpoint manager closed on leaving."""
        from transformer_jax.checkpoints import open_run

        run = open_run(self.workdir.value)
        try:
            yield run
        finally:
            run.checkpointer.close()

    def params(self, run: Any) -> tuple[list[int], Any]:
        """The steps --checkpoint names and their (averaged) parameters."""
        from transformer_jax.checkpoints import checkpoint_params, select_steps

        steps = select_steps(run.checkpointer, self.checkpoint.value, run.config.eval.average_last)
        return steps, checkpoint_params(run, steps)


def define_run_flags(*, checkpoint: str = "latest", cluster: bool = True, devices: bool = False) -> RunFlags:
    """--workdir (required) and --checkpoint; `cluster`: --multihost and the flags it goes with; `devices`:
    --cpu_devices (commands that decode batches)."""
    workdir = flags.DEFINE_string("workdir", None, "The --workdir of a training run (or an imported model).")
    flags.mark_flag_as_required("workdir")
    refuse_blank(workdir, "the directory of a training run (the --workdir it was trained in)")
    spec = flags.DEFINE_string("checkpoint", checkpoint, "latest, best, a step, average:N (mean of the last N), or "
                               "average (the run's eval.average_last).")
    cpu_devices = flags.DEFINE_integer(
        "cpu_devices", None, "On a CPU backend, devices that split each batch's rows (0: one per core, at most 8; "
        "default: the count XLA_FLAGS or JAX_NUM_CPU_DEVICES set, else 0). GPU/TPU backends are not affected.") \
        if devices else None
    shared = define_cluster_flags() if cluster else None
    holders = [workdir, spec, *([cpu_devices] if cpu_devices is not None else [])]
    holders += [getattr(shared, field.name) for field in dataclasses.fields(ClusterFlags)] if shared is not None else []
    register_key_flags(holders)
    return RunFlags(workdir, spec, shared, cpu_devices)


@dataclasses.dataclass(frozen=True)
class SearchFlags:
    """The search settings and decoding dtype (each defaults to the run's eval section); `batch_size` and
    `batch_tokens` where a command decodes batches of many sentences."""

    mode: flags.FlagHolder
    beam_size: flags.FlagHolder
    alpha: flags.FlagHolder
    max_extra_length: flags.FlagHolder
    seed: flags.FlagHolder
    temperature: flags.FlagHolder
    top_k: flags.FlagHolder
    top_p: flags.FlagHolder
    dtype: flags.FlagHolder
    batch_size: flags.FlagHolder | None
    batch_tokens: flags.FlagHolder | None

    def options(self, run_config: Any) -> Any:
        """The run's search settings (decoding.DecodeOptions), overridden by the flags given; a flag of another
        --mode than the one that runs is refused (`DecodeOptions.override`)."""
        from transformer_jax.config import decode_options

        given = {holder.name: holder.value for holder in (self.mode, self.beam_size, self.alpha, self.max_extra_length,
                                                          self.seed, self.temperature, self.top_k, self.top_p)}
        return decode_options(run_config).override(given, as_flags=True)

    def translation(self, run_config: Any) -> dict:
        """How sentences are batched and the dtype they are decoded in: the run's, overridden by the flags; batching
        None when neither --batch_size nor --batch_tokens is given (sized for the devices: `batching_for`)."""
        from transformer_jax.config import decoding_dtype, translation_batching

        batching = None
        if self.batch_size is not None and (self.batch_size.value, self.batch_tokens.value) != (None, None):
            batching = translation_batching(run_config).replace(batch_size=self.batch_size.value,
                                                                batch_tokens=self.batch_tokens.value)
        dtype = decoding_dtype(run_config) if self.dtype.value is None else self.dtype.value
        return dict(batching=batching, dtype=dtype)

    def batching_for(self, run: Any, options: Any, translation: dict, mesh: Any, say: Any) -> dict:
        """`translation` with its batching resolved: the flags', else sized for `mesh`'s devices (said once with
        `say`), else the run's eval batching (CPUs)."""
        from transformer_jax.config import translation_batching
        from transformer_jax.evaluation import sized_batching

        if translation["batching"] is not None:
            return translation
        batching, line = sized_batching(translation_batching(run.config), run.model_config, options,
                                        translation["dtype"], mesh)
        if line:
            say(line)
        return {**translation, "batching": batching}


def define_search_flags(*, batching: bool = True) -> SearchFlags:
    """--mode and its settings, --dtype; `batching`: --batch_size and --batch_tokens. Their choices and limits are
    DecodeOptions' declared ones, and the dtypes a search runs in (decoding.DTYPES)."""
    from transformer_jax.decoding import DTYPES, DecodeOptions

    allowed = DecodeOptions.allowed
    holders = [
        flags.DEFINE_enum("mode", None, list(DecodeOptions.choices("mode")), "Decoding mode (default: beam)."),
        flags.DEFINE_integer("beam_size", None, f"Beam size, {allowed('beam_size')} (default: the run's "
                             "eval.beam_size)."),
        flags.DEFINE_float("alpha", None, f"Length penalty alpha, {allowed('alpha')} (default: the run's eval.alpha)."),
        flags.DEFINE_integer("max_extra_length", None, f"Output length limit: input length + this, "
                             f"{allowed('max_extra_length')} (default: the run's eval.max_extra_length)."),
        flags.DEFINE_integer("seed", None, f"Sampling seed, {allowed('seed')} (--mode=sample; default 0)."),
        flags.DEFINE_float("temperature", None, f"Sampling temperature, {allowed('temperature')} (--mode=sample; "
                           "default 1)."),
        flags.DEFINE_integer("top_k", None, f"Sample among the k most likely tokens, {allowed('top_k')}; 0 = all "
                             "(--mode=sample; default 0)."),
        flags.DEFINE_float("top_p", None, f"Nucleus sampling mass, {allowed('top_p')}; 1 = all (--mode=sample; "
                           "default 1)."),
        flags.DEFINE_enum("dtype", None, [dtype for dtype in DTYPES if dtype], "Decode with weights and matmuls in "
                          "this dtype (default: the run's eval.dtype, else the model's)."),
    ]
    if batching:
        holders += [
            flags.DEFINE_integer("batch_size", None, "Sentences decoded together (default: sized for the "
                                 "devices' memory on GPUs and TPUs, said once; the run's data.eval_batch_size on "
                                 "CPUs)."),
            flags.DEFINE_integer("batch_tokens", None, "Source token slots per batch, at most --batch_size rows "
                                 "(default: sized with --batch_size; on CPUs the run's eval.batch_tokens; 0 = "
                                 "--batch_size sentences)."),
        ]
    register_key_flags(holders)
    return SearchFlags(*holders, *([None, None] if not batching else []))
