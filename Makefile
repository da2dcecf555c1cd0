# loopline: `make demo` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := dev,slurm,triton
CORES ?= 2

.PHONY: demo test test-fast lint bench ui clean install schema

install: $(STAMP)

# Re-install only when the project's dependency list changes: a second `make` is a no-op.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks workflow/scripts
	$(BIN)/snakemake --lint --cores 1

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

schema: $(STAMP)
	$(BIN)/python -m pipeline_lib schema --write

UI_PORT ?= 5000
UI_STORE ?= sqlite:///results/mlflow.db
ui: $(STAMP)
	@echo "MLflow UI on http://127.0.0.1:$(UI_PORT) (store $(UI_STORE)); Ctrl-C stops it"
	$(BIN)/mlflow ui --backend-store-uri $(UI_STORE) --host 127.0.0.1 --port $(UI_PORT) --workers 1

clean:
	rm -rf results logs benchmarks/pack_data benchmarks/train_segment .snakemake
