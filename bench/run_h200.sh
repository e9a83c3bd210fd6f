#!/usr/bin/env bash
# What we run on the H200 machine, in one go: the GPU tests, then the first-call bench with a local server and
# with signature checks on and off. Usage: FA4_AOT_CACHE=<store built with `fa4-aot build --sku h200`> \
#   bash bench/run_h200.sh OUT_DIR      (leaves a signed manifest and fa4-aot.db in that store)
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
python3 -m pytest tests/gpu -q -p no:cacheprovider -W ignore 2>&1 | tee "$out/gpu-tests.log" | tail -5
keys=$(mktemp -d)
python3 -m fa4_aot keys generate --out "$keys" --name bench | tail -1 > "$keys/line"
python3 -m fa4_aot sign --sku h200 --key "$keys/bench.key"
python3 -m fa4_aot serve --port 8700 > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:8700/healthz > /dev/null && break; sleep 0.2; done
token=$(python3 -m fa4_aot token create --scope publish --name "bench-$$")
python3 -m fa4_aot push --server http://127.0.0.1:8700 --token "$token" --sku h200
python3 bench/first_call.py --server http://127.0.0.1:8700 --trusted-keys "$(cat "$keys/line")" \
  --out "$out/first_call.json" 2>&1 | grep -v Warning | tail -12
kill "$server"
