"""A run directory's layout: every file and folder name train.py and eval.py write under --workdir.

  config.json            the run's settings (eval.py rebuilds the model from it)
  tokenizer.model        the SentencePiece model, trained once per run
  corpus/                the prepared training corpus (data/prepared.py), unless data.prepared names one
  run.lock               the job that owns the workdir (cli/lock.py)
  checkpoints/<step>/    Orbax checkpoints; checkpoints.corrupt/ holds damaged ones set aside
  metrics.jsonl, timing.jsonl, tensorboard/    training and dev metrics
  test_final.hyp/.json   the test translation and scores at the end of training
  eval/<split>.<tag>.hyp/.json   eval.py's translations and scores
  plots/                 figures (learning curves, attention maps, positional encodings)
  compilation_cache/     JAX's compiled programs, with --multihost or --compilation_cache=workdir
                         (base/compile_cache.py)
"""

from __future__ import annotations

import os

CONFIG = "config.json"
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


def run_path(workdir: str, *names: str) -> str:
    """`workdir/name/...`: the place of one of the names above (local path or gs:// URL)."""
    return os.path.join(workdir, *names)
