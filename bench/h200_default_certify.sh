#!/usr/bin/env bash
# Issue 27's run on the H200: the default h200 build (variants.toml), then `fa4-aot certify` over the whole store
# twice (the second must find nothing left to check; DC_JOBS workers, default 16), the GPU model suite through both
# runtimes beside the first (tests/gpu/test_h200_models_lean.py; DC_MODELS=0 skips it); with DC_CONCURRENT=1 also rounds
# over the kernels built so far while it builds. Issue 29's figures from the same store, taken between the build and
# certification: build time, object and recipe bytes, a new signature's first call (lean and FA4), and at the end
# a fresh process's first call. DC_REPRO=<findings.jsonl in the tree>: at the end, those findings run through FA4's
# own JIT (bench/repro_findings.py). DC_STEPS=1 (default): also the first call's host steps over a tiny store
# (bench/lean_load_steps.py); DC_FIGURES=0: none of issue 29's figures but the bytes; DC_SECOND=0: no second
# certify run. Run on the device from the repo root, after
# .device/p2/install.sh:
#   bash bench/h200_default_certify.sh start               # snapshot the code, start the pipeline in its own session
#   bash bench/h200_default_certify.sh wait SECONDS OUT    # progress lines until done or SECONDS; results into OUT
# The pipeline runs from a snapshot of the code ($code): later calls re-send the working tree, which must not
# change the code a running build imports.
set -uo pipefail
run=${DC_RUN:-/root/dc}
store=${DC_STORE:-/root/dstore}
code=${DC_CODE:-/root/code}
variants=${DC_VARIANTS:-variants.toml}
py() { PYTHONPATH=$code:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 python3 "$@"; }

pending_keys() {  # kernels of the store with no verdict yet, comma-separated
  py - "$store" <<'EOF'
import sys
from fa4_aot.store import Store
store = Store(sys.argv[1])
done = set(store.verdict_keys())
print(",".join(e.kernel_key for e in store.entries("h200") if not e.is_signpost and e.kernel_key not in done))
EOF
}

case "${1:?start, wait or pipeline}" in
start)
  rm -rf "$code" "$run" "$store"
  mkdir -p "$code/bench" "$run"
  src=${DC_SRC:-.}  # a tree to run instead of the working tree (e.g. a `git archive` of a commit, carried)
  cp -r "$src/fa4_aot" "$src/variants.toml" "$src/pyproject.toml" "$code/"
  [ -d "$src/service" ] && cp -r "$src/service" "$code/"  # tests/conftest.py's server fixtures import it
  cp "$src/bench/h200_default_certify.sh" "$src/bench/recipe_bytes.py" "$src/bench/lean_first_call_profile.py" \
    "$src/bench/lean_new_signature.py" "$src/bench/repro_findings.py" "$src/bench/lean_load_steps.py" "$code/bench/"
  [ -n "${DC_REPRO:-}" ] && cp "$src/$DC_REPRO" "$code/bench/findings.jsonl"
  [ -d "$src/tests" ] && cp -r "$src/tests" "$code/"  # the GPU model suite, run beside certification
  if [ -d "$code/tests/gpu" ] && [ "${DC_MODELS:-1}" = 1 ]; then  # a suite that cannot start says so now, not
    # after the build's ten minutes (session 17: a snapshot without service/ stopped pytest at collection)
    (cd "$code" && py -m pytest -q -p no:cacheprovider --collect-only tests/gpu/test_h200_models_lean.py \
      > "$run/models_collect.txt" 2>&1) || { tail -20 "$run/models_collect.txt"; echo "the model suite does not collect"; exit 3; }
  fi
  cd "$code" && setsid nohup bash bench/h200_default_certify.sh pipeline > "$run/pipeline.log" 2>&1 < /dev/null &
  sleep 2
  echo "pipeline started: $run/pipeline.log"
  ;;
pipeline)
  cd "$code"
  date +%s > "$run/t0"
  # DC_BUILD_POLICY: the build's FA4_AOT_CERTIFIED; unset, known-bad: the default build (the registry in force:
  # what issue 29 times); `off` builds the registry's kernels too, for certification to meet them
  ( FA4_AOT_CERTIFIED=${DC_BUILD_POLICY:-known-bad} py -m fa4_aot --cache-dir "$store" build --sku h200 --variants "$variants" -j "$(nproc)" > "$run/build.log" 2>&1
    echo $? > "$run/build.rc"; date +%s > "$run/build.end" ) &
  round=0
  # DC_CONCURRENT=1: certify what is built so far while it builds (uses the GPU during the build, but the build's
  # time then measures both, and a round races its build: a check whose other kernels are not built yet is an
  # error, no verdict). Default: the build alone (issue 29's build time), then certification.
  [ "${DC_CONCURRENT:-0}" = 1 ] || wait
  until [ -f "$run/build.rc" ]; do  # while it builds: the kernels built so far, a few workers
    keys=$(pending_keys)
    if [ -n "$keys" ]; then
      round=$((round + 1))
      py -m fa4_aot --cache-dir "$store" certify --sku h200 -j 3 --recheck-known-bad --keys "$keys" --json -q \
        > "$run/certify-$round.json" 2> "$run/certify-$round.err"
      rc=$?; echo "$(date +%T) round $round (-j 3, $(tr ',' '\n' <<< "$keys" | grep -c .) kernels): exit $rc"
    fi
    sleep 15
  done
  echo "$(date +%T) build ended: exit $(cat "$run/build.rc"), $(( $(cat "$run/build.end") - $(cat "$run/t0") )) s"
  # issue 29's figures first (a minute): they need the store, not the verdicts; DC_FIGURES=0 skips them
  du -sb "$store"/* > "$run/du.txt" 2>&1
  if [ "${DC_FIGURES:-1}" = 1 ]; then
  py bench/recipe_bytes.py "$store" "$run/recipe_bytes.json" > "$run/recipe_bytes.log" 2>&1
  # lean and FA4 side by side on a small store of its own, built and certified (bench/lean_new_signature.py)
  py bench/lean_new_signature.py --out "$run/new_signature.json" > "$run/new_signature.log" 2>&1
  echo "$(date +%T) issue 29's figures taken"
  fi
  { nproc; df -hT /tmp /dev/shm "$store"; } > "$run/host.txt" 2>&1
  if [ "${DC_STEPS:-1}" = 1 ]; then  # the first call's host steps (bench/lean_load_steps.py) on this host's CPU
    FA4_AOT_CERTIFIED=off py -m fa4_aot --cache-dir /root/tinystore build --sku h200 \
      --variants tests/data/tiny_variants.toml -j "$(nproc)" > "$run/tiny_build.log" 2>&1
    FA4_AOT_SKU=h200 py bench/lean_load_steps.py /root/tinystore "$run/load_steps.json" 15 > "$run/load_steps.log" 2>&1
    rc=$?; echo "$(date +%T) first-call steps: exit $rc"
  fi
  certify() {  # the command issue 27 names, over the whole store; the second must find nothing left
    start=$(date +%s)
    py -m fa4_aot --cache-dir "$store" certify --sku h200 -j "${DC_JOBS:-16}" --recheck-known-bad --json \
      > "$run/certify-final$1.json" 2> "$run/certify-final$1.err"
    rc=$?; echo "$(date +%T) certify over the whole store ($1): exit $rc, $(( $(date +%s) - start )) s"
    journals=${XDG_STATE_HOME:-$HOME/.local/state}/fa4-aot/certify  # each run's outcomes, before the next
    [ -d "$journals" ] && cp -r "$journals" "$run/journals-$1"
  }
  certify 1 &
  # issue 29: the GPU model suite through both runtimes over this store, beside certification (the GPU has
  # room: certify's workers keep to 0.9 of its memory); known-bad kernels refused alike, nothing verdicted yet
  if [ -d tests/gpu ] && [ "${DC_MODELS:-1}" = 1 ]; then
    start=$(date +%s)
    FA4_AOT_CACHE="$store" py -m pytest -q -p no:cacheprovider -rA --tb=short tests/gpu/test_h200_models_lean.py \
      > "$run/models_lean.txt" 2>&1
    rc=$?; echo "$(date +%T) model suite through both runtimes: exit $rc, $(( $(date +%s) - start )) s"
  fi
  wait
  py -m fa4_aot --cache-dir "$store" list --sku h200 --json > "$run/list.json" 2> "$run/list.err"
  py -m fa4_aot --cache-dir "$store" known-bad --sku h200 --json > "$run/known-bad.json" 2>&1
  FA4_AOT_CACHE="$store" py bench/lean_first_call_profile.py "$run/first_call.json" > "$run/first_call.log" 2>&1
  [ "${DC_SECOND:-1}" = 1 ] && certify 2  # DC_SECOND=0: no resume check
  date +%s > "$run/certified"
  if [ -f bench/findings.jsonl ]; then  # DC_REPRO: earlier findings reproduced with FA4's JIT alone
    py bench/repro_findings.py bench/findings.jsonl "$run/repro.json" > "$run/repro.log" 2>&1
    rc=$?; echo "$(date +%T) findings reproduced with FA4 alone: exit $rc"
  fi
  date +%s > "$run/done"
  ;;
wait)
  secs=${2:?seconds}; out=${3:?output folder}
  end=$(( $(date +%s) + secs ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$run/done" ]; do
    sleep 30
    t0=$(cat "$run/t0" 2>/dev/null || date +%s)
    echo "$(( $(date +%s) - t0 )) s | build: $(tail -c 300 "$run/build.log" 2>/dev/null | tr '\r' '\n' | grep . | tail -1) | $(tail -1 "$run/pipeline.log") | $(tail -1 "$run/certify-final1.json" 2>/dev/null | cut -c1-240)"
  done
  mkdir -p "$out"
  journals=${XDG_STATE_HOME:-$HOME/.local/state}/fa4-aot/certify  # a run's outcomes before its verdicts are kept
  [ -d "$journals" ] && cp -r "$journals" "$run/journals-now"
  tar czf "$out/dc.tgz" -C "$run" . 2>/dev/null
  tail -5 "$run/pipeline.log"
  [ -f "$run/done" ] && echo DONE || echo "not done yet"
  ;;
esac
