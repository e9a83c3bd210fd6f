#!/usr/bin/env bash
# Install what the tests need, then run them: the README's test command, and what CI runs (.ci/run installs
# PostgreSQL and qemu-user first, then calls this). No GPU needed: GPU tests skip.
#
#   ./test.sh                                  # the whole suite (about 40 min on 2 cores)
#   ./test.sh tests/store/test_store.py -x     # arguments go to pytest
#
# .venv: torch 2.13.0's CPU build and fa4-aot with its dev, server and farm extras. .venv-cu12: the CUDA 12
# compiler's environment (docker/flavour-venv.sh), which the farm tests build the cu12 SKUs in. .venv-tirx: the
# TIRx FA4 family's compiler (torch's CPU build and fa4-aot[tirx]; nvcc 13.0 must be on PATH). Torch alone comes
# from the PyTorch CPU index (its +cpu build on any machine: build hosts need no CUDA), and only torch: an index
# that cannot be reached then costs one look-up, not one per package. An environment is installed again only when
# pyproject.toml, docker/flavour-venv.sh or this script changed since it was installed (a stamp in it), so a
# second run goes straight to pytest.
set -euo pipefail
cd "$(dirname "$0")"
torch="torch==2.13.0"
cpu_index="https://download.pytorch.org/whl/cpu"
want="$(cat pyproject.toml docker/flavour-venv.sh "$(basename "$0")" | sha256sum | cut -d' ' -f1)"

current() {  # the environment $1 works and was installed from these very files
  [ -x "$1/bin/python" ] && [ "$(cat "$1/.fa4-aot-installed" 2>/dev/null)" = "$want" ]
}

cpu_torch() {  # a new environment $1 holding torch's CPU build (its dependencies come with the next install)
  python3 -m venv "$1"
  "$1/bin/pip" install -q --no-deps --extra-index-url "$cpu_index" "$torch"
}

if ! current .venv; then
  cpu_torch .venv
  .venv/bin/pip install -q "$torch" -e ".[dev,server,farm]"
  echo "$want" > .venv/.fa4-aot-installed
fi
if ! current .venv-cu12; then
  cpu_torch .venv-cu12
  FA4_AOT_FARM=1 docker/flavour-venv.sh 12 .venv-cu12
  echo "$want" > .venv-cu12/.fa4-aot-installed
fi
if ! current .venv-tirx; then  # the TIRx family's compiler (fa4_aot/tirx/toolenv.py finds it here)
  cpu_torch .venv-tirx
  .venv-tirx/bin/pip install -q "$torch" -e ".[tirx]"
  echo "$want" > .venv-tirx/.fa4-aot-installed
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
