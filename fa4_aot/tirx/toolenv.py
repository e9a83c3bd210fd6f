"""The TIRx toolchain: its pins (part of every TIRx kernel key) and the interpreter that has it.

TVM's TIRx compiler (apache-tvm 0.27, ~100 MB) and tirx-kernels live in their own environment, `.venv-tirx` of
the checkout (test.sh makes it; `pip install -e ".[tirx]"` into a venv holding torch's CPU build), kept out of
the build environment as the CUDA 12 compiler is (compile/flavours.py). GPU hosts never need it: a client computes
a kernel's key from these pins, without TVM. A build checks that the environment has exactly the pinned versions
and kernel source before it compiles anything, so a key never names a toolchain that did not make the bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import config
from ..errors import BuildError

# What makes a TIRx kernel's bytes beside its problem and SKU constants. The kernel source digest pins the exact
# flash_attention4.py (sha256 of tirx-kernels 0.1.2.post1's file): a package rebuilt under the same version
# with another kernel fails the build instead of filing other bytes under these keys.
TOOLCHAIN = {
    "tirx-kernels": "0.1.2.post1",
    "apache-tvm": "0.27.0.post1",
    "nvcc": "13.0",
    "kernel-source": "1497c142ed643ee50fea84ed6126b0c91c1e99e252b72b4a70b90a50170126ab",
}
ENV_VAR = "FA4_AOT_PYTHON_TIRX"
MAKE_ENV = ('python3 -m venv .venv-tirx && .venv-tirx/bin/pip install --no-deps --extra-index-url '
            'https://download.pytorch.org/whl/cpu torch==2.13.0 && .venv-tirx/bin/pip install torch==2.13.0 '
            '-e ".[tirx]"')  # torch alone from the CPU index (as the README quick start does)


def python() -> str:
    """The interpreter that compiles TIRx kernels: $FA4_AOT_PYTHON_TIRX, else the checkout's .venv-tirx.
    Raises BuildError with the command that makes one."""
    env = os.environ.get(ENV_VAR)
    if env:
        if not Path(env).is_file():
            raise BuildError(f"{ENV_VAR}={env} does not exist; point it at the python of an environment with "
                             f"fa4-aot[tirx] installed, or make .venv-tirx: {MAKE_ENV}")
        return env
    local = config.CHECKOUT_DIR / ".venv-tirx" / "bin" / "python"
    if local.is_file():
        return str(local)
    raise BuildError(f"TIRx kernels are compiled in their own environment and {local} does not exist; make it "
                     f"with `{MAKE_ENV}` (in the checkout) or set {ENV_VAR} to the python of one")


def drift(found: dict[str, str]) -> list[str]:
    """'name: found X, pinned Y' for every pin the compiling environment does not match."""
    return [f"{name}: found {found.get(name)!r}, pinned {want!r}" for name, want in TOOLCHAIN.items()
            if found.get(name) != want]
