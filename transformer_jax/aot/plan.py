"""From a run config and a topology name to the report and the verdict: fits, or does not fit and why."""

from __future__ import annotations

import dataclasses

import ml_collections

from transformer_jax.aot.compile import Program, compile_lowered, compile_run, program_of, run_data, run_shapes
from transformer_jax.aot.host_input import host_input
from transformer_jax.aot.report import advice, search_line, table, verdict
from transformer_jax.aot.topology import Topology, describe, host_devices, mesh_for
from transformer_jax.base.sharding import make_mesh
from transformer_jax.config.schema import check_run_config, decode_options, decoding_dtype, translation_batching
from transformer_jax.data.batch_content import describe as describe_batches
from transformer_jax.data.shapes import TranslationBatching
from transformer_jax.decoding import DecodeOptions, output_width
from transformer_jax.errors import ConfigError
from transformer_jax.evaluation import sized_batching
from transformer_jax.run.programs import RunPrograms, build_run_for


def plan_run(config: ml_collections.ConfigDict, topology_name: str, num_slices: int = 1,
             hbm_bytes: int | None = None, workdir: str | None = None, search_width: int = 0,
             bulk: BulkSearch | None = None) -> tuple[str, bool]:
    """Compile `config`'s programs for the topology (for the batch shapes of the run's corpus, data.prepared or
    `workdir`'s, when there is one, else rows of data.max_length); returns the report (with the host's input
    time per update when there is a corpus, ending in a verdict line) and whether it fits.

    The search's speed line is for the widest translation batch, and with `search_width` also for sources padded
    to that many tokens (a bulk job's typical batch: `translate-corpus` sorts sentences into widths), in the rows
    the bulk job's batching (`bulk`, default the run's) gives that width on one host process's devices."""
    check_run_config(config)
    if not 0 <= search_width <= config.model.max_len:  # before a corpus is prepared or anything compiled
        raise ConfigError(f"--search_width={search_width} must be 0 (the widest translation batch only) or a source "
                          f"width the model takes, at most its max_len of {config.model.max_len} tokens")
    topology = describe(topology_name, num_slices)
    mesh = mesh_for(topology, config.mesh.data, config.mesh.fsdp)
    accumulation = config.training.accumulation_steps
    data = run_data(config, mesh, workdir)
    built = build_run_for(config, mesh, data)
    try:
        shapes, programs = compile_run(config, mesh, programs=built)
    except Exception as error:  # noqa: BLE001 - only the compiler's out-of-memory verdict is handled
        if "RESOURCE_EXHAUSTED" not in str(error) and "out of memory" not in str(error).lower():
            raise
        detail = (str(error).strip().splitlines() or [""])[0][:300]
        shapes = run_shapes(built)
        return (f"does not fit: the {topology.chip.name} compiler ran out of device memory ({detail}); "
                f"{advice(mesh, shapes, accumulation)}"), False
    result = verdict(shapes, programs, topology, accumulation, hbm_bytes)
    report = table(topology, mesh, shapes, programs, result, accumulation)
    report += search_report(config, built, programs, topology, search_width, bulk)
    if data is None:
        report += ("\nhost input      not measured: no corpus (give --workdir, or --config.data.prepared=DIR from "
                   "python -m transformer_jax.cli.prepare)")
    else:
        report += "\nhost input      " + host_input(data.train, topology.hosts, accumulation).line(result.step_seconds)
        report += "\nbatch content   " + describe_batches(data.train)
    if result.fits:
        return report + "\nfits", True
    return (report + f"\ndoes not fit: {result.peak_bytes / 1e9:.2f} GB per device needed, "
            f"{result.hbm_bytes / 1e9:.2f} GB available; {advice(mesh, shapes, accumulation)}"), False


@dataclasses.dataclass(frozen=True)
class BulkSearch:
    """What `translate-corpus` decodes with: the search settings, the dtype and the translation batching (its
    --mode, --dtype, --batch_size and --batch_tokens flags; by default the run's search, and batches sized for the
    devices: None)."""

    options: DecodeOptions
    dtype: str
    batching: TranslationBatching | None

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> BulkSearch:
        """The run's own: beam search with its eval section, its eval.dtype, batches sized for the devices."""
        return cls(decode_options(config), decoding_dtype(config), None)


def search_report(config: ml_collections.ConfigDict, built: RunPrograms, programs: list[Program], topology: Topology,
                  search_width: int, bulk: BulkSearch | None = None) -> str:
    """The search's speed lines: the compiled widest batch's (the run's search over its mesh), and with
    `search_width` (compiled here) `translate-corpus`'s batch of sources that wide: `bulk`'s search (default: the
    run's) over one host process's devices, as each process of a bulk job translates its own shards."""
    options = decode_options(config)
    max_len = built.model_config.max_len
    rows, width = built.search_shape()
    lines = ["\n" + search_line(program, topology, rows, width,
                                output_width(width, options.max_extra_length, max_len))
             for program in programs if program.name == f"{options.describe()} {rows}x{width}"]
    host = make_mesh(devices=host_devices(topology), where=f"{topology.name}'s first host")
    # What score, translate and translate-corpus search in on one host of this topology when no batch is given.
    sized, said = sized_batching(translation_batching(config), built.model_config, options, decoding_dtype(config),
                                 host, memory=topology.chip.hbm_bytes)
    if said:
        lines.append("\nbatches         " + said)
    if search_width:
        bulk = BulkSearch.of(config) if bulk is None else bulk
        if bulk.batching is None:  # no --batch_size or --batch_tokens: translate-corpus sizes them for the devices
            bulk = dataclasses.replace(bulk, batching=sized_batching(
                translation_batching(config), built.model_config, bulk.options, bulk.dtype, host,
                memory=topology.chip.hbm_bytes)[0])
        name, lowered = built.lower_search(bulk.options, bulk.dtype, search_width, batching=bulk.batching, mesh=host)
        name += f", {bulk.dtype or built.model_config.dtype}"
        rows, width = built.search_shape(search_width, bulk.batching, host)
        longest = output_width(width, bulk.options.max_extra_length, max_len)
        compiled = compile_lowered(name, lowered)
        lines.append("\n" + search_line(program_of(name, compiled), topology, rows, width, longest,
                                        processes=topology.hosts))
    return "".join(lines)
