# Two entry points: `make demo` (the main job) and `make test` (the test suite); `.ci/run` runs `make test-user` (the
# user-compile lane, tests/README.md) after the suite.
# Both create a virtualenv under .venv and install the package with what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

# The main job needs the `train` extra only.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train]'
	touch $@

.PHONY: install test test-user demo bench
install: $(VENV)/.installed

# The tests also compile for TPU topologies on this CPU host (the `tpu` extra: libtpu, ~700 MB) and check the
# Marian import/export against transformers (the `hf` extra; torch 2.13.0's CPU build, named first so that pip
# takes it and not a CUDA build of several GB: about 1.0 GB in the venv with transformers, measured).
$(VENV)/.test: $(VENV)/.installed
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,tpu,hf]'
	touch $@

# On every core (pytest-xdist: a test at a time to whichever worker is free), with the 25 slowest listed.
test: $(VENV)/.installed $(VENV)/.test
	$(PY) -m pytest -n auto --dist worksteal --durations=25 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; fi; exit $$rc

# The user-compile lane (tests/README.md): the tests behind user-facing promises again, compiled as a user's run
# compiles (no suite XLA_FLAGS, no start-up hook). The tests are the first column of tests/README.md's lane table; a
# file to a worker (--dist loadfile), so each module's trained runs are made once.
USER_LANE = $(shell sed -n 's/^| `\(tests\/[^`]*\)` |.*/\1/p' tests/README.md)
test-user: $(VENV)/.installed $(VENV)/.test
	@if [ -z "$(USER_LANE)" ]; then echo "tests/README.md's lane table lists no tests" >&2; exit 5; fi
	TRANSFORMER_JAX_USER_COMPILE=1 $(PY) -m pytest -n auto --dist loadfile --durations=10 $(USER_LANE); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; fi; exit $$rc

demo: $(VENV)/.installed
	$(PY) train.py --config=configs/demo.py --workdir=runs/demo

# Not one of the two set-up commands: the benchmark harness's default sections, with the PyTorch peer; the
# figures go to benchmarks/results/ (see BENCHMARKS.md and benchmarks/results/INDEX.md).
bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m benchmarks.run --json benchmarks/results/bench-$$(date +%F).json
