"""From a run config and a topology name to the report and the verdict: fits, or does not fit and why."""

from __future__ import annotations

import ml_collections

from transformer_jax.aot.compile import compile_run, run_data, run_shapes
from transformer_jax.aot.host_input import host_input
from transformer_jax.data.batch_content import describe as describe_batches
from transformer_jax.training.programs import build_run_for
from transformer_jax.aot.report import advice, table, verdict
from transformer_jax.aot.topology import describe, mesh_for
from transformer_jax.config.schema import check_run_config


def plan_run(config: ml_collections.ConfigDict, topology_name: str, num_slices: int = 1,
             hbm_bytes: int | None = None, workdir: str | None = None) -> tuple[str, bool]:
    """Compile `config`'s programs for the topology (for the batch shapes of the run's corpus, data.prepared or
    `workdir`'s, when there is one, else rows of data.max_length); returns the report (with the host's input
    time per update when there is a corpus, ending in a verdict line) and whether it fits."""
    check_run_config(config)
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
