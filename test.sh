#!/usr/bin/env bash
# Install what the tests need, then run them: the README's test command, and what CI runs (.ci/run installs
# PostgreSQL and qemu-user first, then calls this). No GPU needed: GPU tests skip.
#
#   ./test.sh                                  # the whole suite (about 40 min on 2 cores)
#   ./test.sh tests/store/test_store.py -x     # arguments go to pytest
#
# .venv: torch 2.13.0's CPU build and fa4-aot with its dev, server and farm extras. .venv-cu12: the CUDA 12
# compiler's environment (docker/flavour-venv.sh), which the farm tests build the cu12 SKUs in. .venv-tirx: the
# TIRx FA4 family's compiler (torch's CPU build and fa4-aot[tirx]; nvcc 13.0 must be on PATH). .venv-numsim: NumSim,
# which simulates a built TIRx kernel on the CPU (Python 3.12, made only where one is found). Torch alone comes
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
python312() {  # a Python 3.12 that runs (pyenv's shim answers for a version only when it is selected)
  local candidate
  for candidate in "$HOME"/.pyenv/versions/3.12.*/bin/python "$(command -v python3.12 || true)"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}
# NumSim, tirx-harness's CPU simulator of TIRx kernels (fa4_aot/tirx/simulation.py): Python 3.12 and its own
# apache-tvm-ffi. Its wheel alone, then what the simulation imports with their pins; left out of the wheel's pins:
# nvidia-cutlass-dsl, pypandoc-binary, nvidia-cuda-nvrtc and -nvdisasm (730 MB that NumSim's path never imports),
# hence pip's "requires ... which is not installed" lines, which are dropped.
py312="$(python312)"
if [ -z "$py312" ]; then
  echo "no Python 3.12: .venv-numsim not made, the NumSim test will be skipped" >&2
elif ! current .venv-numsim; then
  rm -rf .venv-numsim && "$py312" -m venv .venv-numsim
  .venv-numsim/bin/pip install -q --no-deps tirx-harness==0.1.2.post2
  .venv-numsim/bin/pip install -q apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 tirx-kernels==0.1.2.post1 \
    "numpy>=2.5.3" "threadpoolctl>=3.6,<4" pytest 2>&1 | { grep -v "^tirx-harness .* requires \|dependency resolver" || true; }
  echo "$want" > .venv-numsim/.fa4-aot-installed
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
