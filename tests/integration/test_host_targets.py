"""Issue 19, on real FA4 cross-compiles: what a build host makes runs on every host CPU of the SKU.

- Host code is generated for the SKU's host target, never for the build CPU: no object or library of an
  x86-64-v3 SKU has an instruction beyond that baseline (objdump, scanned for AVX-512 operands), although this
  build host has AVX-512, and the bytes equal those built on another CPU (tests/data/store_h200_xeon).
- A Grace SKU (host neoverse-v2) built on this x86 host stores AArch64 objects and libraries, each library
  needing exactly libtvm_ffi.so and libcute_dsl_runtime.so, with CuTe's AArch64 runtime beside them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fa4_aot import hosts
from fa4_aot.store import Entry, Store
from tests.conftest import TINY_VARIANTS, build_json

pytestmark = pytest.mark.slow
OTHER_CPU = TINY_VARIANTS.parent / "store_h200_xeon"
RUNTIME = "libcute_dsl_runtime.so"


def _built(store: Path) -> dict[str, Entry]:
    return {e.kernel_key: e for e in Store(store).entries()}


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
