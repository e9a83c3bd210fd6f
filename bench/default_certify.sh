#!/usr/bin/env bash
# Certification of the default build on one Hopper GPU of any SKU (h100-sxm, h200...), with the first-call figures
# on the same host, as one background pipeline:
#   1. the default build of the present GPU's SKU with the registry off (FA4_AOT_CERTIFIED=off), so that
#      certification meets FA4's known-bad kernels itself; beside it (little CPU) the small stores the first-call
#      benches time: bench/lean_new_signature.py --rounds 0 (each version's store, built and certified) and
#      tests/data/tiny_variants.toml's (bench/lean_load_steps.py). DC_NEW_SIGNATURE=0 skips both;
#   2. on the quiet host: a new signature's first call, lean against FA4, before (DC_BEFORE, an older tree) against
#      after, DC_ROUNDS fresh processes each (default 2); then the first call's host steps (lean_load_steps.py);
#   3. `fa4-aot certify --recheck-known-bad -j 16` over the default store: repeats, FA4's JIT as the oracle, scopes,
#      repros;
#   4. a summary (bench/default_certify_summary.py): time, verdicts, findings by origin, marginal misses, measured
#      entries with their scopes, and one measured entry's repro run on the GPU.
# DC_DEFAULT=0 skips 1's default build and 3-4; DC_MODELS=1 then certifies a few models' store (certify_models.sh,
# without its model suite): repros run on the GPU and ViT-H/14 training's refusal through both runtimes.
# DC_DEFAULT=prebuilt skips 1's build and certifies the store already at DC_STORE: the default build made on a CPU
# build host, as fa4-aot is meant to be used (its build.json beside it, when there is one, is copied into the run).
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
  rm -rf "$code" "$run" && mkdir -p "$code" "$run"
  [ "${DC_DEFAULT:-1}" = prebuilt ] || rm -rf "$store"  # a prebuilt store is the run's input: kept
  cp -r fa4_aot bench service tests variants.toml pyproject.toml "$code/"
  cd "$code" && setsid nohup bash bench/default_certify.sh pipeline > "$run/pipeline.log" 2>&1 < /dev/null &
  sleep 1; echo "started: $run/pipeline.log"
  ;;
wait)  # then the results so far into $OUT (when set): what a lease that ends mid-run still brings back
  end=$(( $(date +%s) + ${2:-500} ))
  while [ ! -e "$run/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 10; done
  cat "$run/pipeline.log"
  if [ -n "${OUT:-}" ]; then
    (cd "$run" && find . -maxdepth 2 -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.err' \
      -o -name '*.py' \) \
      -size -20M -exec cp --parents {} "$OUT/" \;)
    journals=${XDG_STATE_HOME:-$HOME/.local/state}/fa4-aot/certify  # each certify run's outcomes as they come
    [ -d "$journals" ] && tar -czf "$OUT/certify-journals.tar.gz" -C "$journals" . 2>/dev/null
  fi
  ;;
pipeline)
  cd "$code"
  sku=$(py -m fa4_aot skus --detect --json | py -c 'import json, sys; print(json.load(sys.stdin)["served_by"])')
  stamp "SKU $sku ($(nvidia-smi --query-gpu=name --format=csv,noheader)), $(nproc) CPUs"
  before=${DC_BEFORE:+--before $DC_BEFORE}
  t=$(date +%s)
  builder=
  if [ "${DC_DEFAULT:-1}" = prebuilt ]; then
    test -d "$store/objects" || { stamp "DC_DEFAULT=prebuilt: no store at $store"; touch "$run/done"; exit 3; }
    [ -f "$store.build.json" ] && cp "$store.build.json" "$run/build.json"
    stamp "prebuilt store at $store: $(find "$store/objects" -type f | wc -l) objects"
  fi
  if [ "${DC_DEFAULT:-1}" = 1 ]; then
  # DC_BUILD_POLICY: the build's FA4_AOT_CERTIFIED (default off: the registry's kernels built too, for certification
  # to meet FA4's known bugs; known-bad: the default build as users run it, 5% fewer kernels and findings)
  ( FA4_AOT_CERTIFIED=${DC_BUILD_POLICY:-off} py -m fa4_aot --cache-dir "$store" build --sku "$sku" -j "$jobs" --json \
      > "$run/build.json" 2> "$run/build.err"; echo $? > "$run/build.rc" ) &
  builder=$!
  fi
  if [ "${DC_NEW_SIGNATURE:-1}" = 1 ]; then
    py bench/lean_new_signature.py --out "$run/new_signature_prepare.json" --rounds 0 --work "$run/nsw" $before \
      > "$run/new_signature_prepare.log" 2>&1
    stamp "first-call stores prepared: rc=$?"; grep -h '"build_s"' "$run"/nsw/*/stores.json
    FA4_AOT_CERTIFIED=off py -m fa4_aot --cache-dir "$run/tinystore" build --sku h200 \
      --variants tests/data/tiny_variants.toml -j 2 > "$run/tiny_build.log" 2>&1
    stamp "tiny store rc=$?"
  fi
  if [ -n "$builder" ]; then
    wait $builder
    stamp "build rc=$(cat "$run/build.rc") in $(( $(date +%s) - t )) s: $(tail -c 400 "$run/build.json")"
  fi
  if [ "${DC_NEW_SIGNATURE:-1}" = 1 ]; then
    t=$(date +%s)
    py bench/lean_new_signature.py --out "$run/new_signature.json" --rounds "${DC_ROUNDS:-2}" --work "$run/nsw" \
      $before --before-runtimes "${DC_BEFORE_RUNTIMES:-lean,fa4}" > "$run/new_signature.log" 2>&1
    stamp "new signature rc=$? in $(( $(date +%s) - t )) s:"; tail -12 "$run/new_signature.log"
    FA4_AOT_SKU=h200 py bench/lean_load_steps.py "$run/tinystore" "$run/load_steps.json" "${DC_STEP_ROUNDS:-15}" \
      > "$run/load_steps.log" 2>&1
    stamp "first-call host steps rc=$?"; head -c 1500 "$run/load_steps.log"
  fi
  if [ -n "$builder" ] || [ "${DC_DEFAULT:-1}" = prebuilt ]; then
    t=$(date +%s)
    # the run's journal (each check's outcome and its steps), copied as it grows: certify removes it at the end
    journals=${XDG_STATE_HOME:-$HOME/.local/state}/fa4-aot/certify
    ( mkdir -p "$run/journal"; while sleep 5; do cp "$journals"/*.jsonl "$run/journal/" 2>/dev/null; done ) &
    copier=$!
    py -m fa4_aot --cache-dir "$store" certify --sku "$sku" --recheck-known-bad -j "$jobs" --json -q \
      > "$run/certify.json" 2> "$run/certify.err"
    stamp "certify rc=$? in $(( $(date +%s) - t )) s"; tail -5 "$run/certify.err"
    kill $copier 2>/dev/null
    py bench/default_certify_summary.py "$run/certify.json" "$store" "$sku" "$run"
    stamp "summary rc=$?"
  fi
  if [ "${DC_MODELS:-0}" = 1 ]; then  # the models' store certified: repros run, ViT-H/14's refusal (certify_models.sh)
    CM_RUN=$run/models CM_STORE=$run/models-store CM_SUITE=0 CM_STORE_VS_JIT=0 PYTHONPATH="$code${PYTHONPATH:+:$PYTHONPATH}" \
      bash bench/certify_models.sh pipeline > "$run/models.log" 2>&1
    stamp "models rc=$?:"; cat "$run/models.log"
  fi
  touch "$run/done"
  ;;
esac
