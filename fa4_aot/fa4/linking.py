"""Link an exported kernel object (export_to_c, TVM-FFI ABI) into a shared library that loads with tvm_ffi alone.

The object's undefined symbols are resolved by the two runtime libraries CuTe DSL names for loading TVM-FFI
modules (cutlass.runtime.find_runtime_libraries): libtvm_ffi.so (from the apache-tvm-ffi wheel, which a lean
GPU host has) and libcute_dsl_runtime.so (CuTe's C runtime, which statically includes the CUDA runtime; it is
only in the 237 MB nvidia-cutlass-dsl-libs-cu13 wheel, so the store carries it as an object of its own).
The library records both only by SONAME (DT_NEEDED, no RPATH): the lean client loads them first (lean.py).
"""

from __future__ import annotations

import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from ..config import host_arch as host_arch  # the architecture of what this host links
from ..errors import BuildError

# SONAMEs a linked kernel needs, in the order the client loads them.
NEEDED = ("libtvm_ffi.so", "libcute_dsl_runtime.so")


@lru_cache(maxsize=1)
def runtime_libraries() -> dict[str, Path]:
    """{SONAME: path} of the runtime libraries in this build environment."""
    from cutlass.runtime import find_runtime_libraries

    found = {Path(p).name: Path(p) for p in find_runtime_libraries(enable_tvm_ffi=True)}
    missing = [name for name in NEEDED if name not in found]
    if missing:
        raise BuildError(f"CuTe DSL names no {', '.join(missing)} (found {sorted(found)}); reinstall "
                         "nvidia-cutlass-dsl[cu13] and apache-tvm-ffi on the build host")
    return {name: found[name] for name in NEEDED}


def link(object_bytes: bytes, compiler: str = "gcc") -> bytes:
    """The shared library of one exported kernel object. Raises BuildError with the linker's message."""
    libs = runtime_libraries()
    with tempfile.TemporaryDirectory(prefix="fa4-aot-link-") as tmp:
        obj, out = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        obj.write_bytes(object_bytes)
        command = [compiler, "-shared", "-o", str(out), str(obj)]
        for path in libs.values():
            command += [f"-L{path.parent}", f"-l:{path.name}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise BuildError(f"{compiler} is not installed: the build host links kernels for the lean runtime; "
                             "install it (apt-get install gcc)") from None
        if done.returncode != 0:
            raise BuildError(f"linking a kernel failed ({' '.join(command)}): {done.stderr.strip()[:500]}")
        return out.read_bytes()
