"""A run directory's layout: every file and folder name train.py and eval.py write under --workdir.

  config.json            the run's settings (eval.py rebuilds the model from it)
  config_changes.jsonl   settings changed at a resume: one dated line each (run/setting_changes.py)
  tokenizer.model        the SentencePiece model, trained once per run
  corpus/                the prepared training corpus (data/prepared.py), unless data.prepared names one
  run.lock               the job that owns the workdir (base/lock.py)
  checkpoints/<step>/    Orbax checkpoints; checkpoints.corrupt/ holds damaged ones set aside
  metrics.jsonl, timing.jsonl, tensorboard/    training and dev metrics
  test_final.hyp/.json   the test translation and scores at the end of training
  eval/<split>.<tag>.hyp/.json   eval.py's translations and scores
  plots/                 figures (learning curves, attention maps, positional encodings)
  profile/               jax.profiler traces of a few updates (training.profile_steps): one folder per trace
                         below it (JAX's plugins/profile/<time>/): the XSpace, perfetto_trace.json.gz and
                         <host>.trace.json.gz
  compilation_cache/     JAX's compiled programs, with --multihost or --compilation_cache=workdir
                         (base/compile_cache.py)

`check_layout` refuses a workdir where one of these names is of the wrong kind (a file where a folder
belongs, or the reverse), before anything is written; `RunWatch` tells when the workdir, or what a run
needs in it, vanishes while a run writes it.
"""

from __future__ import annotations

import os
import time
from typing import Iterable

from transformer_jax.base.files import DirectoryWatch, exists, is_dir, is_file, list_names
from transformer_jax.errors import CheckpointError

CONFIG = "config.json"
CONFIG_CHANGES = "config_changes.jsonl"
TOKENIZER = "tokenizer.model"
CORPUS = "corpus"
LOCK = "run.lock"
CHECKPOINTS = "checkpoints"
CORRUPT_SUFFIX = ".corrupt"  # checkpoints.corrupt/: damaged checkpoints set aside
METRICS = "metrics.jsonl"
TIMING = "timing.jsonl"
TENSORBOARD = "tensorboard"
FINAL_TEST = "test_final"  # + .hyp / .json
EVAL = "eval"
PLOTS = "plots"
LEARNING_CURVES = "learning_curves.png"
POSITIONAL_ENCODING_PLOT = "positional_encoding.png"
COMPILATION_CACHE = "compilation_cache"
WANDB = "wandb"  # Weights & Biases' local files (training.wandb_project)
WANDB_RUN_ID = "wandb_run_id"  # the W&B run a resumed run goes on logging to
PROFILE = "profile"  # jax.profiler's traces (training.profile_steps)
PERFETTO_TRACE = "perfetto_trace.json.gz"  # the Chrome/Perfetto trace JSON jax.profiler writes beside its XSpace
TRACE_VIEWER_SUFFIX = ".trace.json.gz"  # <host>.trace.json.gz: the same events as TensorBoard's trace viewer JSON


def run_path(workdir: str, *names: str) -> str:
    """`workdir/name/...`: the place of one of the names above (local path or gs:// URL)."""
    return os.path.join(workdir, *names)


# What each name above holds, and whether as a file or a directory: what `check_layout` holds the workdir to.
FILE, DIRECTORY = "file", "directory"
ENTRIES = {
    CONFIG: (FILE, "settings"), CONFIG_CHANGES: (FILE, "changed settings"), TOKENIZER: (FILE, "tokenizer"),
    CORPUS: (DIRECTORY, "prepared corpus"),
    LOCK: (FILE, "lock"), CHECKPOINTS: (DIRECTORY, "checkpoints"),
    CHECKPOINTS + CORRUPT_SUFFIX: (DIRECTORY, "damaged checkpoints set aside"), METRICS: (FILE, "metrics"),
    TIMING: (FILE, "timing log"), TENSORBOARD: (DIRECTORY, "TensorBoard events"),
    FINAL_TEST + ".hyp": (FILE, "test translation"), FINAL_TEST + ".json": (FILE, "test scores"),
    EVAL: (DIRECTORY, "evaluations"), PLOTS: (DIRECTORY, "figures"),
    COMPILATION_CACHE: (DIRECTORY, "compiled programs"), WANDB: (DIRECTORY, "Weights & Biases files"),
    WANDB_RUN_ID: (FILE, "Weights & Biases run id"), PROFILE: (DIRECTORY, "profiler traces"),
}


def check_layout(workdir: str, names: Iterable[str] = ENTRIES) -> None:
    """Raise CheckpointError naming the first of `names` (of ENTRIES; default all) in `workdir` that is of the
    wrong kind (a file where the run keeps a directory, or the reverse): before a run (train.py) or an output of
    eval.py writes anything, so a refused start changes nothing."""
    if not is_dir(workdir):
        return  # nothing there yet, or not a directory: the checks that open or create the workdir name it
    present = set(list_names(workdir))
    for name in names:
        kind, what = ENTRIES[name]
        if name not in present:
            continue
        path = run_path(workdir, name)
        found = DIRECTORY if is_dir(path) else FILE if is_file(path) else "special file"
        if found != kind:
            raise CheckpointError(
                f"{path} is a {found}, but a run keeps its {what} in a {kind} of that name; move it away (or put "
                f"back the {kind} it replaced) and run the same command again"
            )


class RunWatch:
    """Tells when a run directory, or the run's files and folders in it, vanish under a run (`rm -rf`, an unmount).

    `rm -rf` removes the files first, failing the run's writes, and the directory itself last, or never
    when Orbax writes to it meanwhile (it makes a checkpoint's parents anew): so both count.
    """

    # What a run cannot go on without (outputs such as plots/ a user may well remove while it runs).
    NEEDED = (CONFIG, TOKENIZER, CORPUS, CHECKPOINTS, METRICS)

    def __init__(self, workdir: str) -> None:
        self.workdir, self.directory = workdir, DirectoryWatch(workdir)
        self.names: list[str] = []  # the names of NEEDED the workdir held at `note_names`

    def note_names(self) -> None:
        """Note which of NEEDED the workdir holds now (what `missing` compares with)."""
        self.names = [name for name in list_names(self.workdir) if name in self.NEEDED]

    def missing(self) -> list[str]:
        """The names noted that the workdir holds no more."""
        try:
            present = set(list_names(self.workdir)) if exists(self.workdir) else set()
        except OSError:  # removed while being listed
            present = set()
        return [name for name in self.names if name not in present]

    def vanished(self, patience: float = 0.0) -> str | None:
        """What vanished ("the workdir X", "config.json, corpus and 3 more of the workdir X"), or None.

        With names missing but the workdir still there, its removal is waited for up to `patience` seconds.
        """
        deadline = time.monotonic() + patience
        while True:
            if self.directory.vanished():
                return f"the workdir {self.workdir}"
            missing = self.missing()
            if not missing:
                return None
            if time.monotonic() >= deadline:
                more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
                return f"{', '.join(sorted(missing)[:3])}{more} of the workdir {self.workdir}"
            time.sleep(0.05)

    def close(self) -> None:
        """Let the workdir go."""
        self.directory.close()
