# PipeSim: `make run` runs the embedded default simulation, `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-all bench native clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# the engine's hot modules compiled with mypyc (sim/native.py); rebuilt when their sources change
native: $(STAMP)
	$(PY) -m sim.native_build --if-stale

run: native
	$(VENV)/bin/ppsim run experiments/configs/default.toml --out runs/default --force

# --durations=25: the slowest tests in every CI log (make test must stay under its time budget)
test: native
	$(PY) -m pytest -q --durations=25

test-all: native
	$(PY) -m pytest -q --runslow

bench: native
	$(PY) benchmarks/engine.py

clean:
	rm -rf $(VENV) runs build *.egg-info
