#!/usr/bin/env bash
# Build exactly what tests/gpu/test_h200_models.py runs, on a CPU host (no GPU needed):
#   bench/build_suite.sh                 # h200 into cache/ (or $FA4_AOT_CACHE), 2 compiler processes
#   SKU=h200 JOBS=8 bench/build_suite.sh
# One `fa4-aot build --model NAME --tp N --workload ...` per (model, TP degree) of the suite's SUITE list.
# Then, on the GPU host with that cache: python -m pytest -q -p no:cacheprovider tests/gpu/test_h200_models.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SKU=${SKU:-h200}
JOBS=${JOBS:-2}
start=$(date +%s)
mapfile -t builds < <("$PY" -m tests.gpu.test_h200_models)
for args in "${builds[@]}"; do
  # shellcheck disable=SC2086  # each line is an argument list
  "$PY" -m fa4_aot build --sku "$SKU" -j "$JOBS" $args
done
echo "built ${#builds[@]} model/TP sets for $SKU in $(( $(date +%s) - start ))s" >&2
