#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one call (a lent GPU machine; CI has none):
#   bash benchmarks/lease/on_gpu.sh FLAX_CHECKOUT OUTDIR
# 1. the machine and versions; 2. the attention tests, whose cuDNN cases skip without a GPU (the cuDNN kernel
# against the einsum path with packing, causal and padding masks; a bfloat16 Transformer's loss and every
# gradient with cuDNN's attention against einsum's, padding queries included: its passing is what lets "auto"
# pick cuDNN, attention_kernels.GPU_AUTO_BACKEND), with cuDNN out of XLA's command buffers as train.py runs it;
# 3. the accelerators section on this GPU: our train step ("auto"'s attention, as before both) and the Flax WMT
# example's, timed at the paper's rows per device, and both beam searches. Each part is time-limited and writes
# its log to OUTDIR; a failing part does not stop the next. Runs from the repository root with the machine's
# own JAX. On one H100 (2026-11-26): the tests about 70 s; each train step's compile 30-50 s, the searches'
# about 10 s, so 12 rows take about 7 minutes in all. TESTS_SECONDS, SECTION_SECONDS and TIMED_ROWS (e.g.
# 12,96) override the defaults.
# A lease's first call is the end-to-end run instead (train.py with a profile, a preemption, a short training with
# each attention backend, eval.py; the tables), with carry [".whl", "runs/lease"] (see benchmarks/lease/gpu_run.py):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && R=$(mktemp -d) && \
#   python3 -m benchmarks.lease.gpu_run run --lease runs/lease --out $R/r; cp $R/r/summary.json $OUT/
# and this script the second, for the small-batch timing against the example: TIMED_ROWS=12,96 with the example's
# checkout carried too (e.g. runs/lease/flax holding examples/wmt of google/flax).
set -u
checkout=$1
out=$2
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, jax, flax, optax; print(sys.version.split()[0], 'jax', jax.__version__, 'flax', \
flax.__version__, 'optax', optax.__version__, jax.devices())"
} 2>&1 | tee "$out/env.txt"
XLA_FLAGS="--xla_gpu_enable_command_buffer=-CUDNN ${XLA_FLAGS:-}" timeout "${TESTS_SECONDS:-150}" \
  python3 -m pytest -q -p no:cacheprovider -rs tests/model/test_attention.py tests/model/test_attention_kernels.py \
  2>&1 | tee "$out/tests.txt"
timeout "${SECTION_SECONDS:-420}" python3 -m benchmarks.run --sections accelerators --flax_checkout "$checkout" \
  --accel_runs '' --accel_timed_rows "${TIMED_ROWS:-12}" --json "$out/accelerators.json" 2>&1 \
  | tee "$out/accelerators.txt"
