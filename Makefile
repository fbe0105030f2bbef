# OpenMP threads spin-wait on a busy machine unless told otherwise; it must be set before
# torch, lightgbm or scikit-learn is imported (docs/stack.md, "OpenMP").
export OMP_WAIT_POLICY := passive
export BENTOML_DO_NOT_TRACK := true
export MLFLOW_ALLOW_FILE_STORE := false

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slow test-all demo lint bench default-model clean

$(STAMP): pyproject.toml requirements-pins.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so the resolver takes the local CPU wheel instead of a CUDA build
	$(BIN)/pip install -q -c requirements-pins.txt torch==2.13.0
	# the extras too: CI tests the transformers and Lightning integrations
	$(BIN)/pip install -q -c requirements-pins.txt -e '.[dev,hf,lightning]'
	touch $(STAMP)

install: $(STAMP)

# the default run leaves out the tests marked slow (served memory over 100k requests, the
# README's demo figures, retrain end to end, SIGKILL at random ...): ~10 min against ~35
# for all on 2 cores. CI runs both (.ci/run); test-all is the two in one pytest.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/collapse-guard demo

lint: $(STAMP)
	$(BIN)/ruff check collapse_guard tests benchmarks
	$(BIN)/ruff format --check collapse_guard tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/probe_overhead.py
	$(BIN)/python benchmarks/features_speed.py

# Rebuilds the bundled model (collapse_guard/predictor/default_model, < 5 MB) from the real
# runs in REAL, by default the whole corpus pack in the repository (every folder of run files
# under corpus/: corpus/README.md), so a fresh clone rebuilds it from the repo alone; no
# synthetic runs (they did not help on held-out families; SYNTHETIC=400 adds them):
#   make default-model                                  # from corpus/real and corpus/breadth
#   make default-model REAL="data/real data/more" OUT=/tmp/model   # other folders, a scratch folder
# It refuses a data set with fewer runs or collapses than the model it replaces: FORCE=1.
default-model: $(STAMP)
	$(BIN)/python -m collapse_guard.predictor.cli.bundle --synthetic $(or $(SYNTHETIC),0) --work data/bundle-synthetic$(foreach d,$(REAL), --real $(d))$(if $(OUT), --out $(OUT))$(if $(FORCE), --force)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
