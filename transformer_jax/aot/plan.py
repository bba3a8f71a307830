"""From a run config and a topology name to the report and the verdict: fits, or does not fit and why."""

from __future__ import annotations

import ml_collections

from transformer_jax.aot.compile import compile_run, run_programs, run_shapes
from transformer_jax.aot.report import advice, table, verdict
from transformer_jax.aot.topology import describe, mesh_for
from transformer_jax.config.schema import check_run_config


def plan_run(config: ml_collections.ConfigDict, topology_name: str, num_slices: int = 1,
             hbm_bytes: int | None = None, workdir: str | None = None) -> tuple[str, bool]:
    """Compile `config`'s programs for the topology (for the batch shapes of `workdir`'s corpus when given,
    else rows of data.max_length); returns the report (ending in a verdict line) and whether it fits."""
    check_run_config(config)
    topology = describe(topology_name, num_slices)
    mesh = mesh_for(topology, config.mesh.data, config.mesh.fsdp)
    accumulation = config.training.accumulation_steps
    built = run_programs(config, mesh, workdir)
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
    if result.fits:
        return report + "\nfits", True
    return (report + f"\ndoes not fit: {result.peak_bytes / 1e9:.2f} GB per device needed, "
            f"{result.hbm_bytes / 1e9:.2f} GB available; {advice(mesh, shapes, accumulation)}"), False
