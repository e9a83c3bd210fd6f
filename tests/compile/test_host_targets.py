"""Issue 19, on real FA4 cross-compiles: what a build host makes runs on every host CPU of the SKU.

- Host code is generated for the SKU's host target, never for the build CPU: no object or library of an
  x86-64-v3 SKU has an instruction beyond that baseline (objdump, scanned for AVX-512 operands), although this
  build host has AVX-512, and the bytes equal those built on another CPU (tests/data/store_h200_xeon).
- A Grace SKU (host neoverse-v2) built on this x86 host stores AArch64 objects and libraries, each library
  needing exactly libtvm_ffi.so and libcute_dsl_runtime.so, with CuTe's AArch64 runtime beside them; under an
  AArch64 emulator (qemu-user) such a library opens with every symbol bound.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from fa4_aot.domain import hosts, kernel_keys
from fa4_aot.fa4 import linking
from fa4_aot.store import Entry, Store
from tests.conftest import TINY_VARIANTS, build_json

pytestmark = pytest.mark.slow
OTHER_CPU = TINY_VARIANTS.parent / "store_h200_xeon"
RUNTIME = "libcute_dsl_runtime.so"


def _built(store: Path) -> dict[str, Entry]:
    """Entries by what they are apart from the toolchain: their key recomputed with none. Keys name the source
    of FA4, CuTe and fa4-aot's patches (issue 20, point 5), so a store committed before, or built by another
    commit of fa4-aot, has other keys for the same kernels; what this test proves is the bytes, kernel by kernel."""
    found = {}
    for e in Store(store).entries():
        bare = kernel_keys.entry_keys(dataclasses.replace(e, toolchain={}))
        found[bare[kernel_keys.entry_keys(e).index(e.kernel_key)]] = e
    return found


def _ours(entry: Entry) -> list[str]:
    """Digests of the bytes this build generated for `entry`: its object and linked libraries (not the vendor's
    runtime libraries they need, which are copies of NVIDIA's wheel files)."""
    return [entry.object_digest, *(lib["digest"] for lib in entry.shared_libs.values())]


def test_objects_and_libraries_equal_those_built_on_another_cpu(tmp_path: Path) -> None:
    report = build_json(tmp_path, "h200", jobs=2)
    assert report["failed"] == 0 and report["lean_failures"] == []
    here, there = _built(tmp_path), _built(OTHER_CPU)
    assert set(here) == set(there) and len(here) >= 5
    for key, entry in here.items():
        assert entry.host == "x86-64-v3"
        assert _ours(entry) == _ours(there[key]), f"{entry.call}: bytes differ from another build CPU's"
        # the same versions built both (the committed store predates source digests: it names versions only)
        assert there[key].toolchain.items() <= entry.toolchain.items(), "rebuild tests/data/store_h200_xeon"


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils) to disassemble")
def test_no_instruction_beyond_the_host_targets_baseline(tmp_path: Path) -> None:
    build_json(tmp_path, "h200", jobs=2)
    store, target = Store(tmp_path), hosts.get("x86-64-v3")
    scanned = 0
    for entry in store.entries():
        for digest in _ours(entry):
            path = store.object_path(digest)
            text = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
            assert text.count("\n") > 100  # a real disassembly, or the scan proves nothing
            assert hosts.isa_violations(text, target) == [], f"{entry.call}: AVX-512 in {digest[:12]}"
            scanned += 1
    assert scanned >= 10


def test_a_grace_sku_stores_aarch64_objects_and_libraries(tmp_path: Path) -> None:
    grace = build_json(tmp_path / "gh200", "gh200", "full-fwd", jobs=1)
    x86 = build_json(tmp_path / "h200", "h200", "full-fwd", jobs=1)
    assert grace["failed"] == 0 and grace["lean_failures"] == [] and grace["kernels"] >= 1
    assert not set(grace["kernel_keys"]) & set(x86["kernel_keys"])  # same GPU figures, other host: other keys
    store = Store(tmp_path / "gh200")
    for entry in store.entries():
        assert entry.host == "neoverse-v2" and list(entry.shared_libs) == ["aarch64"]
        assert hosts.elf_arch(store.read_object(entry.object_digest)) == "aarch64"
        lib = entry.shared_libs["aarch64"]
        path = store.object_path(lib["digest"])
        assert hosts.elf_arch(path.read_bytes()) == "aarch64"
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        assert [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line] == [
            "libtvm_ffi.so", RUNTIME]
        assert lib["needs"]["libtvm_ffi.so"] == ""  # the client's own apache-tvm-ffi
        assert hosts.elf_arch(store.read_object(lib["needs"][RUNTIME])) == "aarch64"


AARCH64_ROOT = Path("/usr/aarch64-linux-gnu")  # Debian's libc6-arm64-cross and libstdc++6-arm64-cross
LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {  /* dlopen each library in turn, then find the kernel's entry in the last */
  void *h = 0;
  for (int i = 1; i < argc; i++)
    if (!(h = dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL))) { printf("dlopen %s: %s\n", argv[i], dlerror()); return 1; }
  printf("__tvm_ffi_func %s\n", dlsym(h, "__tvm_ffi_func") ? "found" : "missing");
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("qemu-aarch64") is None or not (AARCH64_ROOT / "lib" / "libstdc++.so.6").exists(),
                    reason="needs qemu-user and Debian's arm64 cross libc and libstdc++ (.ci/run installs them)")
def test_a_grace_library_loads_under_an_aarch64_emulator(tmp_path: Path) -> None:
    """The AArch64 library a Grace build stores opens (every symbol bound: RTLD_NOW) in an AArch64 process, with
    the AArch64 libtvm_ffi.so of its wheel and the CuTe runtime the store carries, as a lean client opens them."""
    build_json(tmp_path / "gh200", "gh200", "full-fwd", jobs=1)
    store = Store(tmp_path / "gh200")
    lib = next(iter(store.entries())).shared_libs["aarch64"]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(tmp_path), "--platform", "manylinux_2_28_aarch64", "--python-version",
                    f"{sys.version_info.major}.{sys.version_info.minor}",
                    f"apache-tvm-ffi=={metadata.version('apache-tvm-ffi')}"], check=True, timeout=600)
    with zipfile.ZipFile(next(tmp_path.glob("apache_tvm_ffi-*.whl"))) as wheel:
        (tmp_path / "libtvm_ffi.so").write_bytes(wheel.read("tvm_ffi/lib/libtvm_ffi.so"))
    shutil.copy(store.object_path(lib["needs"][RUNTIME]), tmp_path / RUNTIME)
    shutil.copy(store.object_path(lib["digest"]), tmp_path / "kernel.so")
    (tmp_path / "load.c").write_text(LOADER)
    subprocess.run([*linking.zig(), "cc", "-target", "aarch64-linux-gnu", "-o", str(tmp_path / "load"),
                    str(tmp_path / "load.c")], check=True, timeout=300)
    done = subprocess.run(["qemu-aarch64", "-L", str(AARCH64_ROOT), "./load", "./libtvm_ffi.so", f"./{RUNTIME}",
                           "./kernel.so"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "__tvm_ffi_func found"), done.stdout + done.stderr
