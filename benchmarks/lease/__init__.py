"""The lease tools: what runs only on a lent GPU machine, in calls of under 10 minutes each (from the repository root).

Entry points:
- `python -m benchmarks.lease.gpu_run prepare --text DIR --out runs/lease` (here, on a CPU): the corpus the lease
  trains on and the preflight's predictions for the GPU kinds it lends; then `run --lease runs/lease --out DIR`
  (on the GPU): train.py with a profile, a preemption, a short training per attention backend, eval.py, the
  decode and comparison phases, and the tables (`--rehearse` runs the same on a CPU with a tiny model).
- `python -m benchmarks.lease.decode` and `python -m benchmarks.lease.compare`: the run's decode phase (sentences/s
  per search mode, compile seconds, a profiled search batch) and its comparison with transformers' `generate` and
  CTranslate2 on the exported run; `gpu_run run` starts both, each can also be run alone on a trained run.
- `bash benchmarks/lease/on_gpu.sh FLAX_CHECKOUT OUTDIR`: the attention tests that need a GPU, then the harness's
  accelerators section (`python -m benchmarks.run --sections accelerators`) timing our train step and the Flax
  WMT example's on the device.

`records` reads back what a run wrote (timing.jsonl, the logs, the prediction, the profile) into the tables.
A lease: `gpu_run prepare` here, its output and the wheels the GPU image lacks carried to the machine; the first
call `gpu_run run`, the second `on_gpu.sh`. The figures go to docs/benchmarks/accelerators.md with their raw
output under benchmarks/results/.
"""
