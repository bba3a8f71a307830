"""The sections of the benchmark harness, one module each (names and one-line summaries: run.SECTIONS).

Each module has `run(args) -> figures`: it prints its table and returns what goes into the JSON file.
Sections that need a fresh process (CPU device counts, platforms, several JAX processes, a peer
framework) also have `worker(spec)`, started through `workers.worker_command`. Comparisons with earlier
revisions are recorded in docs/benchmarks/history.md (the revision to check out, the figures), not run here.
"""
