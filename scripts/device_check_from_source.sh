#!/usr/bin/env bash
# The device check from a source tree, on a GPU machine whose own Python already has a CUDA
# build of torch (and numpy, pyarrow, tokenizers, safetensors, tqdm, yaml, tensorboard) but
# not loopline's other dependencies: the one it needs, omegaconf, travels as a wheel in .whl/
# (`make device-wheels` fetches it where pip can reach PyPI). MLflow, lm-eval and Snakemake
# are not needed: without lm-eval its check is skipped with the reason.
#
#   bash scripts/device_check_from_source.sh [--only CHECK …] [key=value …]
#
# Writes $OUT/device_check.json (OUT defaults to docs/device), the results so far after every
# check; then, here: `make device-results` (docs/performance.md's device section from that JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/loopline-site .whl/*.whl
export PYTHONPATH="/tmp/loopline-site:$PWD/src" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
out="${OUT:-docs/device}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
exec python3 benchmarks/device_check.py --out "$out/device_check.json" \
  --budget-s "${BUDGET_S:-420}" experiment.device=cuda experiment.precision=bf16 "$@"
