#!/usr/bin/env bash
# Issue 27's checks on the H200, in one go (results in bench/RESULTS.md):
#   bash bench/certify_h200.sh OUT_DIR [STORE]
# 1. builds tests/data/certify_variants.toml (FA4's known sm_90 bugs beside controls) with the known-bad registry
#    off, so the kernels it names are there to be measured (kept in STORE, default /root/certify-store, across calls);
# 2. the GPU tests of certification (tests/gpu/test_h200_certify.py: certify finds them and survives; both runtimes
#    refuse them with the reason and serve the rest);
# 3. bench/certify_cost.py: the run's rate and a certified kernel's first call against an unchecked one's.
set -uo pipefail
out=${1:?output folder}
store=${2:-/root/certify-store}
mkdir -p "$out"
if [ ! -f "$store/.complete" ]; then
  start=$(date +%s)
  FA4_AOT_CERTIFIED=off python3 -m fa4_aot --cache-dir "$store" build --sku h200 \
    --variants tests/data/certify_variants.toml -j "$(nproc)" -q > "$out/build.log" 2>&1 && touch "$store/.complete"
  echo "build: $(( $(date +%s) - start )) s, exit $(test -f "$store/.complete" && echo 0 || echo 1)" | tee -a "$out/build.log"
  tail -3 "$out/build.log"
fi
FA4_AOT_CACHE=$store python3 -m pytest tests/gpu/test_h200_certify.py -q -p no:cacheprovider -s -W ignore \
  2>&1 | tee "$out/gpu-certify.log" | tail -40
FA4_AOT_CACHE=$store python3 bench/certify_cost.py --out "$out/certify_cost.json" 2>&1 | tail -40
