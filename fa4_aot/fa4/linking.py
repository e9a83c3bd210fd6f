"""Link an exported kernel object (TVM-FFI ABI) into a shared library that loads with tvm_ffi alone, for the
SKU's host target (fa4_aot/domain/hosts.py), from any build host.

The object's undefined symbols are resolved by the two runtime libraries CuTe DSL names for loading TVM-FFI
modules (cutlass.runtime.find_runtime_libraries): libtvm_ffi.so (from the apache-tvm-ffi wheel, which a lean
GPU host has) and libcute_dsl_runtime.so (CuTe's C runtime, which statically includes the CUDA runtime; it is
only in the nvidia-cutlass-dsl-libs-cu* wheel, so the store carries it as an object of its own). The library
records both only by SONAME (DT_NEEDED, no RPATH): the lean client loads them first (runtime/libraries.py).

Linking is hermetic: zig's linker (the ziglang wheel) for the target's triple, against empty stand-ins that
carry only those SONAMEs, so the bytes depend on the object and the zig version, not on the build host's gcc,
binutils or CPU. The runtime library the store carries must be the target architecture's real one: this
environment's own when the target runs on the build host's architecture, else the target's wheel, fetched
once (`pip download`) into the host-library cache (FA4_AOT_HOST_LIBS, default ~/.cache/fa4-aot/host-libs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from ..config import host_arch
from ..domain.hosts import HostTarget, elf_arch
from ..errors import BuildError
from ..store.atomic import atomic_write
from .versions import cutlass_cuda_flavor

# SONAMEs a linked kernel needs, in the order the client loads them.
NEEDED = ("libtvm_ffi.so", "libcute_dsl_runtime.so")
# The wheel platforms pip may take the target's runtime library from, per architecture
_PLATFORMS = {"aarch64": ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux2014_aarch64"),
              "x86_64": ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64")}


def host_libs_dir() -> Path:
    """$FA4_AOT_HOST_LIBS, else ~/.cache/fa4-aot/host-libs: runtime libraries of other architectures."""
    return Path(os.environ.get("FA4_AOT_HOST_LIBS") or Path.home() / ".cache" / "fa4-aot" / "host-libs").expanduser()


@lru_cache(maxsize=1)
def _local_libraries() -> dict[str, Path]:
    from cutlass.runtime import find_runtime_libraries

    found = {Path(p).name: Path(p) for p in find_runtime_libraries(enable_tvm_ffi=True)}
    missing = [name for name in NEEDED if name not in found]
    if missing:
        raise BuildError(f"CuTe DSL names no {', '.join(missing)} (found {sorted(found)}); reinstall "
                         "nvidia-cutlass-dsl[cu13] and apache-tvm-ffi on the build host")
    return {name: found[name] for name in NEEDED}


def runtime_libraries(host: HostTarget) -> dict[str, Path | None]:
    """{SONAME: path} of the runtime libraries a library for `host` needs, in NEEDED order: CuTe's runtime for
    `host`'s architecture (the store carries it), and None for libtvm_ffi.so (a lean client has its own)."""
    cute = _local_libraries()["libcute_dsl_runtime.so"] if host.arch == host_arch() else foreign_runtime(host.arch)
    return {"libtvm_ffi.so": None, "libcute_dsl_runtime.so": cute}


def foreign_runtime(arch: str) -> Path:
    """libcute_dsl_runtime.so for `arch` from the nvidia-cutlass-dsl-libs wheel of this environment's version
    and CUDA flavour, fetched once into host_libs_dir(). Raises BuildError naming what to download by hand."""
    flavor, version = cutlass_cuda_flavor(), metadata.version("nvidia-cutlass-dsl")
    dist = f"nvidia-cutlass-dsl-libs-{flavor}=={version}"
    path = host_libs_dir() / arch / f"{flavor}-{version}" / "libcute_dsl_runtime.so"
    if not path.is_file():
        with tempfile.TemporaryDirectory(prefix="fa4-aot-wheel-") as tmp:
            wheel = _download(dist, arch, Path(tmp))
            with zipfile.ZipFile(wheel) as z:
                data = z.read(f"nvidia_cutlass_dsl/{flavor}/lib/libcute_dsl_runtime.so")
        if elf_arch(data) != arch:
            raise BuildError(f"{wheel.name} holds a {elf_arch(data)} libcute_dsl_runtime.so, not {arch}")
        atomic_write(path, data)
    return path


def _download(dist: str, arch: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(into),
               "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}", dist]
    for platform in _PLATFORMS.get(arch, ()):
        command += ["--platform", platform]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise BuildError(
            f"fetching {dist} for {arch} failed ({done.stderr.strip()[-300:]}); the {arch} host target needs the "
            f"runtime library of that wheel: download it elsewhere and put its nvidia_cutlass_dsl/*/lib/"
            f"libcute_dsl_runtime.so at {host_libs_dir() / arch}/<flavour>-<version>/")
    return wheels[0]


@lru_cache(maxsize=1)
def zig() -> list[str]:
    """The command that runs zig (the ziglang wheel): its binary itself where the wheel has one, as
    `python -m ziglang` only starts an interpreter to exec it (27 of 33 ms CPU a link, once per kernel).
    Raises BuildError with the install command."""
    try:
        import ziglang
    except ImportError:
        raise BuildError("the lean runtime's libraries are linked by zig; install it on the build host: "
                         "pip install 'fa4-aot[build]' (or ziglang==0.17.0)") from None
    binary = Path(ziglang.__file__).parent / "zig"
    return [str(binary)] if os.name == "posix" and os.access(binary, os.X_OK) else [sys.executable, "-m", "ziglang"]


@lru_cache(maxsize=4)
def _stand_ins(target: str) -> Path:
    """A folder of empty shared libraries for zig target `target`, one per NEEDED SONAME: what the linker
    records as DT_NEEDED, with nothing of the real libraries' contents in the result. Made once per host, zig
    version and target in host_libs_dir() (a temp folder per process was left behind by every build)."""
    folder = host_libs_dir() / "needed" / f"zig-{metadata.version('ziglang')}" / target
    for name in NEEDED:
        if not (folder / name).is_file():
            with tempfile.TemporaryDirectory(prefix="fa4-aot-needed-") as tmp:
                source, out = Path(tmp) / "empty.c", Path(tmp) / name
                source.write_text("")
                _run([*zig(), "cc", "-target", target, "-shared", "-nostdlib", f"-Wl,-soname,{name}", "-o",
                      str(out), str(source)])
                atomic_write(folder / name, out.read_bytes())
    return folder


def link(object_bytes: bytes, host: HostTarget) -> bytes:
    """The shared library of one exported kernel object, for `host`. Raises BuildError with the linker's
    message, or when the object is for another architecture than `host`."""
    if elf_arch(object_bytes) != host.arch:
        raise BuildError(f"a {elf_arch(object_bytes)} object cannot be linked for host target {host.name}")
    needed = _stand_ins(host.zig)
    with tempfile.TemporaryDirectory(prefix="fa4-aot-link-") as tmp:
        obj, out = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        obj.write_bytes(object_bytes)
        _run([*zig(), "cc", "-target", host.zig, "-shared", "-o", str(out), str(obj), f"-L{needed}",
              "-Wl,--no-as-needed", *(f"-l:{name}" for name in NEEDED)])
        return out.read_bytes()


def warm(host: HostTarget) -> None:
    """Fill zig's caches for `host` by linking an empty object as link() links a kernel: a build's first link
    for a target compiles zig's libc stubs and compiler_rt for it (about 20 CPU s), and each worker's first link
    waits on it. The build driver calls this while its workers plan, so that wait is hidden. Errors are the
    real links' to report: none is raised here."""
    try:
        with tempfile.TemporaryDirectory(prefix="fa4-aot-warm-") as tmp:
            source, obj = Path(tmp) / "empty.c", Path(tmp) / "empty.o"
            source.write_text("")
            _run([*zig(), "cc", "-target", host.zig, "-c", "-o", str(obj), str(source)])
            link(obj.read_bytes(), host)
    except (BuildError, OSError, subprocess.SubprocessError):
        return


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise BuildError(f"linking failed ({' '.join(command)}): {done.stderr.strip()[:500]}")
