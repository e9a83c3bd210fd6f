#!/usr/bin/env bash
# Build exactly what tests/gpu/test_h200_models.py runs (no GPU needed; on a CPU host or on the GPU host):
#   bench/build_suite.sh                      # h200 into cache/ (or $FA4_AOT_CACHE), 2 compiler processes
#   SKU=h200 JOBS=16 bench/build_suite.sh      # e.g. on the 16-core H200 host
# Writes a variants file with the SKU table and one model entry (models/tp/workloads) per (model, TP degree) of
# the suite's SUITE list, and builds it with one `fa4-aot build`, so each kernel is compiled once.
# Then, with that cache: python -m pytest -q -p no:cacheprovider tests/gpu/test_h200_models.py
# (and tests/gpu/test_h200_models_lean.py: the same calls through both runtimes, equal served counts).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SKU=${SKU:-h200}
JOBS=${JOBS:-2}
file=$(mktemp --suffix=.toml)
trap 'rm -f "$file"' EXIT
"$PY" -m tests.gpu.test_h200_models > "$file"
"$PY" -m fa4_aot build --sku "$SKU" --variants "$file" -j "$JOBS" "$@"
