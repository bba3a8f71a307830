"""A training run assembled in one place: the config checked, the workdir checked, the mesh, the data, the programs
and the checkpointer; `Trainer` (loop.py) receives it and trains.

The order is the one a start needs: nothing is written to the workdir before its layout and logs are checked,
the corpus is prepared (or read) for the mesh's rows, and the programs are built for the corpus's batch shapes.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import ml_collections
from jax.sharding import Mesh

from transformer_jax.base import say
from transformer_jax.base import workdir as layout
from transformer_jax.base.sharding import make_mesh, mesh_platform
from transformer_jax.checkpoints.manager import Checkpointer, best_metric_for
from transformer_jax.config.parallel_text import sizing_line
from transformer_jax.config.schema import check_run_config
from transformer_jax.data.pipeline import RunData, prepare_data
from transformer_jax.base.log_records import check_logs
from transformer_jax.run.programs import RunPrograms, build_run_for
from transformer_jax.run.setting_changes import check_state_settings


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """What one run trains with: its settings and workdir, device mesh, data, programs and checkpoints."""

    config: ml_collections.ConfigDict
    workdir: str
    mesh: Mesh
    data: RunData
    programs: RunPrograms
    checkpointer: Checkpointer
    started: float  # time.perf_counter() when assembling began (timing.jsonl's startup_seconds counts from it)

    def close(self) -> None:
        """Release the checkpointer (Trainer.close does, for a run it trained)."""
        self.checkpointer.close()


def assemble_run(config: ml_collections.ConfigDict, workdir: str, data: RunData | None = None, *,
                 checked: bool = False) -> TrainingRun:
    """Check `config` and `workdir`, then build the mesh, the data (`data`, or the corpus the config names,
    prepared in or read from the workdir), the programs for its batch shapes and the checkpointer. `checked`: the
    caller has checked `config` (check_run_config) already, as train.py does before it makes the workdir.

    The config, the workdir's layout, the settings a resume could not restore its checkpoints with and the logs are
    checked before anything is written (a refused start leaves the workdir as it was); the corpus and the tokenizer
    are then prepared in the workdir (or read), and the programs built for them, which may still refuse the
    settings (ConfigError). The checkpoints folder is made last, once the train state is known to fit the devices.
    """
    started = time.perf_counter()
    if not checked:
        check_run_config(config)
    if (sizing := sizing_line(config)) is not None:  # the sizes chosen for the user, after their overrides
        say(sizing)
    layout.check_layout(workdir)
    check_state_settings(workdir, config)  # a resume whose settings could not restore the checkpoints
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp)
    check_logs(workdir)
    data = data or prepare_data(
        config, workdir, row_multiple=mesh.size,
        process_index=jax.process_index(), process_count=jax.process_count(), platform=mesh_platform(mesh),
    )
    programs = build_run_for(config, mesh, data)
    programs.check_state_fits()
    checkpointer = Checkpointer(layout.run_path(workdir, layout.CHECKPOINTS), config.training.keep_checkpoints,
                                *best_metric_for(config.training.bleu_every))
    return TrainingRun(config, workdir, mesh, data, programs, checkpointer, started)
