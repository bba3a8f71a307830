"""The benchmarks: one harness, `python -m benchmarks.run --sections ...` (from the repository root).

`run` (the harness: flags, the machine's description, one table per section, one JSON file) ->
`sections/` (one module per section, each with `run(args) -> figures`) over `models` (the models timed and
their run, built by the run builder on one device), `corpora` (synthetic batches and corpora), `workers`
(contenders in worker processes, timed alternately) and `peer_torch` (PyTorch's nn.Transformer, the train
step's peer). Figures and the raw output behind them: BENCHMARKS.md and results/INDEX.md.

The benchmarks import transformer_jax only through its subpackages' public APIs (their `__init__`).
"""
