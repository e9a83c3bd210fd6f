"""The toolchain a kernel key names: versions of the packages that generate kernels, and the CUDA flavour of
the CuTe compiler. Changing any of them changes every kernel key (fa4_aot.kernel_keys)."""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import metadata

# The distributions whose code generates the kernels. Changing any of them changes the keys.
TOOLCHAIN_DISTRIBUTIONS = ("flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")


@lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    """Installed versions of the kernel-generating packages, plus the CUDA flavour of the CuTe compiler."""
    versions = {}
    for dist in TOOLCHAIN_DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    versions["cutlass-dsl-cuda"] = cutlass_cuda_flavor()
    return versions


def cutlass_cuda_flavor() -> str:
    """'cu12' or 'cu13': the toolkit flavour the CuTe compiler loaded (it picks the newest one installed when
    no driver is present). Imports cutlass, so call it only where FA4 is about to be used anyway."""
    import cutlass  # noqa: F401  (loads the flavoured _cutlass_ir module)

    module = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    name = getattr(module, "__file__", "") or ""
    for part in name.split("."):
        if part.startswith("cu") and part[2:].isdigit():
            return part
    return "unknown"
