"""The benchmarks: the harness, `python -m benchmarks.run --sections ...`, and in lease/ a lent GPU's tools.

`run` (the harness: flags, the machine's description, one table per section, one JSON file) ->
`sections/` (one module per section, each with `run(args) -> figures`) over `models` (the models timed and
their run, built by the run builder on one device), `corpora` (synthetic batches and corpora), `workers`
(contenders in worker processes, timed alternately), `peer_torch` (PyTorch's nn.Transformer, the train
step's peer), `peer_flax` and `device_steps` (the Flax WMT example and the timings on a GPU or TPU, for the
accelerators section). `lease/` holds what runs only on a lent GPU machine: the end-to-end run and its decode
and comparison phases, and the GPU checks (its docstring says how a lease uses them). Besides them,
`machine_reference` and `suite_cpu` gauge the machine and the test suite's CPU. Figures and the raw output
behind them: BENCHMARKS.md and results/INDEX.md; figures of earlier code: docs/benchmarks/history.md.

Both run from the repository root and import transformer_jax only through its subpackages' public APIs
(their `__init__`).
"""
