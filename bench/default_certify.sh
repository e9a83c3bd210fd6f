#!/usr/bin/env bash
# Certification of the default build on one Hopper GPU of any SKU (h100-sxm, h200...), as one background pipeline:
#   0. (DC_NEW_SIGNATURE=1) a new signature's first call, lean against FA4, before against after
#      (bench/lean_new_signature.py, on a quiet host first: it times milliseconds; DC_BEFORE names the older tree);
#   1. the default build of the present GPU's SKU with the registry off (FA4_AOT_CERTIFIED=off), so that
#      certification meets FA4's known-bad kernels itself;
#   2. `fa4-aot certify --recheck-known-bad -j 16` over that store: repeats, FA4's JIT as the oracle, scopes, repros;
#   3. a summary: time, verdicts, findings by origin, marginal misses, measured entries with their scopes, and one
#      measured entry's repro run on the GPU (it needs only torch and FA4: its exit status says whether FA4 fails).
# On the device, from the repo root, after .device/p2/install.sh && source /root/fa4env.sh:
#   bash bench/default_certify.sh start            # snapshot the code, start the pipeline in its own session
#   bash bench/default_certify.sh wait SECONDS     # progress until done or SECONDS; the log at the end
# The pipeline runs from a snapshot of the code ($code): later calls re-send the working tree, which must not change
# the code that a running build imports.
set -uo pipefail
run=${DC_RUN:-/root/dc}
store=${DC_STORE:-/root/dstore}
code=${DC_CODE:-/root/code}
jobs=${DC_JOBS:-16}
py() { PYTHONUNBUFFERED=1 PYTHONPATH="$code${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"; }
stamp() { echo "$(date -u +%T) $*"; }

case "${1:?start, wait or pipeline}" in
start)
  rm -rf "$code" "$run" "$store" && mkdir -p "$code" "$run"
  cp -r fa4_aot bench variants.toml pyproject.toml "$code/"
  cd "$code" && setsid nohup bash bench/default_certify.sh pipeline > "$run/pipeline.log" 2>&1 < /dev/null &
  sleep 1; echo "started: $run/pipeline.log"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ ! -e "$run/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 10; done
  cat "$run/pipeline.log"
  ;;
pipeline)
  cd "$code"
  sku=$(py -m fa4_aot skus --detect --json | py -c 'import json, sys; print(json.load(sys.stdin)["served_by"])')
  stamp "SKU $sku ($(nvidia-smi --query-gpu=name --format=csv,noheader)), $(nproc) CPUs"
  if [ "${DC_NEW_SIGNATURE:-0}" = 1 ]; then
    t=$(date +%s)
    py bench/lean_new_signature.py --out "$run/new_signature.json" ${DC_BEFORE:+--before "$DC_BEFORE"} \
      > "$run/new_signature.log" 2>&1
    stamp "new signature rc=$? in $(( $(date +%s) - t )) s:"; tail -40 "$run/new_signature.log"
  fi
  t=$(date +%s)
  FA4_AOT_CERTIFIED=off py -m fa4_aot --cache-dir "$store" build --sku "$sku" -j "$jobs" --json \
    > "$run/build.json" 2> "$run/build.err"
  stamp "build rc=$? in $(( $(date +%s) - t )) s: $(tail -c 400 "$run/build.json")"
  t=$(date +%s)
  py -m fa4_aot --cache-dir "$store" certify --sku "$sku" --recheck-known-bad -j "$jobs" --json -q \
    > "$run/certify.json" 2> "$run/certify.err"
  stamp "certify rc=$? in $(( $(date +%s) - t )) s"; tail -5 "$run/certify.err"
  py bench/default_certify_summary.py "$run/certify.json" "$store" "$sku" "$run"
  stamp "summary rc=$?"
  touch "$run/done"
  ;;
esac
