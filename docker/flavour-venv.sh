#!/usr/bin/env bash
# Create a build environment for one CUDA flavour of the CuTe DSL compiler.
#
#   docker/flavour-venv.sh 12 .venv-cu12     # then: export FA4_AOT_PYTHON_CU12=$PWD/.venv-cu12/bin/python
#
# The cu12 and cu13 flavours cannot share one environment: nvidia-cutlass-dsl always installs its cu12 libraries,
# and with no CUDA driver (a CPU build host) the compiler loads the newest flavour present. A cu13 environment is
# the project's default install (nvidia-cutlass-dsl[cu13]); a cu12 one must hold no cu13 libraries, so fa4-aot
# is installed without its dependency list and the rest are named here with the project's pins.
# FA4_AOT_FARM=1 adds Ray (needed when the Ray executor runs this flavour's tasks through this interpreter).
set -euo pipefail
major="${1:?usage: flavour-venv.sh 12|13 VENV_DIR}"
venv="${2:?usage: flavour-venv.sh 12|13 VENV_DIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"
case "$major" in
  12) cutlass="nvidia-cutlass-dsl==4.8.1" ;;
  13) cutlass="nvidia-cutlass-dsl[cu13]==4.8.1" ;;
  *) echo "flavour-venv.sh: CUDA major must be 12 or 13, got $major" >&2; exit 2 ;;
esac
extra=()
if [ "${FA4_AOT_FARM:-0}" = 1 ]; then extra+=("ray==2.60.0"); fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 "$cutlass" flash-attn-4==4.0.0b36 apache-tvm-ffi==0.1.15.post2 \
  quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5 triton numpy "click>=8.1" "cryptography>=42" "httpx>=0.27" \
  ziglang==0.17.0 \
  "${extra[@]}"
"$venv/bin/pip" install -q --no-deps -e "$root"
if [ "$major" = 12 ] && "$venv/bin/pip" show -q nvidia-cutlass-dsl-libs-cu13 2>/dev/null; then
  echo "flavour-venv.sh: $venv holds nvidia-cutlass-dsl-libs-cu13; a cu12 environment must not" >&2; exit 1
fi
echo "$venv: CUDA $major build environment ($("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])'))"
