"""CUDA flavours of the CuTe DSL compiler, and which Python environment builds each one.

nvidia-cutlass-dsl ships a cu12 and a cu13 compiler; with no CUDA driver (a CPU build host) it loads the newest
one installed, and `nvidia-cutlass-dsl` always installs cu12 beside an optional cu13. So a CUDA 12 SKU is built
by an interpreter of an environment without the cu13 libraries, and one build can span two environments.
Which interpreter builds CUDA major N is read at call time: $FA4_AOT_PYTHON_CU<N>, else this interpreter when
its flavour is N, else `.venv-cu<N>/bin/python` of the checkout. Nothing here imports cutlass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .. import config
from ..errors import BuildError


def own_cuda_major() -> int:
    """The CUDA major of the compiler this interpreter would load on a host without a driver (newest flavour)."""
    for major in (13, 12):
        try:
            metadata.version(f"nvidia-cutlass-dsl-libs-cu{major}")
            return major
        except metadata.PackageNotFoundError:
            continue
    raise BuildError(f"{sys.executable} has no CuTe DSL compiler; install fa4-aot with its build extra "
                     "(pip install -e '.[build]')")


def python_for(cuda_major: int) -> str:
    """The interpreter that builds CUDA `cuda_major` SKUs. Raises BuildError with the command that makes one."""
    env = os.environ.get(f"FA4_AOT_PYTHON_CU{cuda_major}")
    if env:
        if not Path(env).is_file():
            raise BuildError(f"FA4_AOT_PYTHON_CU{cuda_major}={env} does not exist; point it at the python of a "
                             f"CUDA {cuda_major} environment (docker/flavour-venv.sh {cuda_major} VENV)")
        return env
    if own_cuda_major() == cuda_major:
        return sys.executable
    local = config.CHECKOUT_DIR / f".venv-cu{cuda_major}" / "bin" / "python"
    if local.is_file():
        return str(local)
    raise BuildError(
        f"CUDA {cuda_major} SKUs need a CUDA {cuda_major} build environment, and {sys.executable} has the "
        f"cu{own_cuda_major()} compiler; create one with `docker/flavour-venv.sh {cuda_major} .venv-cu{cuda_major}` "
        f"(it is found there) or set FA4_AOT_PYTHON_CU{cuda_major} to its python"
    )


def is_own(python: str) -> bool:
    """Whether `python` is this interpreter. Symlinks are not resolved: a venv's python links to the base one."""
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def worker_env() -> dict[str, str]:
    """Environment variables a worker of another interpreter needs to import this checkout's fa4_aot first."""
    # An installed fa4_aot lives in site-packages, which must not leak into another flavour's worker.
    own = [str(config.CHECKOUT_DIR)] if (config.CHECKOUT_DIR / "pyproject.toml").is_file() else []
    paths = [*own, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


@lru_cache(maxsize=8)
def sys_path_of(python: str) -> tuple[str, ...]:
    """sys.path of `python` started with worker_env(): what a spawned worker of it must import from."""
    out = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"], capture_output=True,
                         text=True, env={**os.environ, **worker_env()}, timeout=120, check=True)
    return tuple(json.loads(out.stdout))
