"""Installation.object_for, the answer FA4's compile caches get, on a CPU without FA4: strict misses, fallback
misses, integrity before loading.

Keys here are plain tuples standing in for FA4 compile keys and the toolchain is a fixed dict, so nothing here
imports FA4; what is under test is the contract (verify first, strict raises with the fix, fallback records
the miss and counts FA4's compile). The seam's cache over it is tests/fa4/test_fa4_caches.py; loading a
real kernel needs a GPU: tests/gpu covers it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fa4_aot.client import Installation
from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Constants, Sku
from fa4_aot.errors import IntegrityError, KernelMissing
from fa4_aot.store import Entry, Store
from fa4_aot.trust.policy import Trust

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
KEY = (True, 128, "bf16-ish", None)
TOOLS = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1", "cutlass-dsl-cuda": "cu13"}


def _installation(tmp_path: Path, mode: str) -> Installation:
    store = Store(tmp_path)
    return Installation(sku=SKU, store=store, mode=mode, trace=[], trust=Trust(SKU, store, None, {}), tools=TOOLS)


def _publish(store: Store, key: tuple, data: bytes) -> Entry:
    digest = store.put_object(data)
    kk = kernel_keys.kernel_key("_flash_attn_fwd", key, SKU, TOOLS)
    entry = Entry(kernel_key=kk, object_digest=digest, size=len(data),
                  family="_flash_attn_fwd", compile_key=kernel_keys.canonical(key), sku=SKU.name, arch=SKU.arch,
                  sm_count=SKU.sm_count, l2_bytes=SKU.l2_bytes, cuda_major=SKU.cuda_major, toolchain=TOOLS,
                  variant="t", call="c", compile_seconds=0.0, host=SKU.host)
    store.put_entry(entry)
    return entry


def test_strict_miss_names_sku_family_and_fix(tmp_path: Path) -> None:
    with pytest.raises(KernelMissing) as info:
        _installation(tmp_path, "strict").object_for("_flash_attn_fwd", KEY)
    message = str(info.value)
    assert "SKU h200" in message and "_flash_attn_fwd" in message
    # the narrow build (issue 30, point 8): a kernel asked for outside a known call is recorded, then built
    assert "FA4_AOT_RECORD=calls.jsonl" in message and "fa4-aot build --sku h200 --calls calls.jsonl" in message
    assert info.value.kernel_key == kernel_keys.kernel_key("_flash_attn_fwd", KEY, SKU, TOOLS)
    assert not list(Store(tmp_path).misses())


def test_fallback_miss_is_recorded_and_compile_counted(tmp_path: Path) -> None:
    inst = _installation(tmp_path, "fallback")
    assert inst.object_for("_flash_attn_fwd", KEY) is None
    inst.compiled("_flash_attn_fwd", KEY)  # what the seam's cache reports after FA4 compiled it
    assert inst.stats.compiled == 1
    assert inst.stats.misses == [kernel_keys.kernel_key("_flash_attn_fwd", KEY, SKU, TOOLS)]
    [miss] = Store(tmp_path).misses()
    assert miss.kernel_key == kernel_keys.kernel_key("_flash_attn_fwd", KEY, SKU, TOOLS) and miss.sku == "h200"


def test_corrupt_object_is_refused_before_loading(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = _publish(store, KEY, b"\x7fELF not really a kernel")
    path = store.object_path(entry.object_digest)
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as info:
        _installation(tmp_path, "strict").object_for("_flash_attn_fwd", KEY)
    assert info.value.expected == entry.object_digest and info.value.source == str(path)


def test_a_whole_object_is_found_by_path(tmp_path: Path) -> None:
    entry = _publish(Store(tmp_path), KEY, b"\x7fELF a kernel")
    inst = _installation(tmp_path, "strict")
    assert inst.object_for("_flash_attn_fwd", KEY) == Store(tmp_path).object_path(entry.object_digest)
    assert inst.stats.misses == [] and not list(Store(tmp_path).misses())


# -- issue 13: a kernel that consumed SKU constants loads only where the device's values equal them ----------
B200 = Sku(name="b200", arch="sm_100a", sm_count=148, l2_bytes=132644864, cuda_major=13)


def _publish_consuming(store: Store, sm_count: int, data: bytes) -> Entry:
    """File a kernel that consumed the SM count as `build` does: full key, and the base key if absent."""
    entry = Entry(kernel_key="", object_digest=store.put_object(data), size=len(data), family="_flash_attn_fwd",
                  compile_key=kernel_keys.canonical(KEY), sku="b200", arch="sm_100a", sm_count=sm_count,
                  l2_bytes=B200.l2_bytes, cuda_major=13, toolchain=TOOLS, variant="t", call="c",
                  compile_seconds=0.0, hardware_queries=[["sm_count", sm_count]], host=B200.host)
    base, full = kernel_keys.entry_keys(entry)
    store.put_entry(dataclasses.replace(entry, kernel_key=full))
    if not store.has_entry(base):
        store.put_entry(dataclasses.replace(entry, kernel_key=base))
    return dataclasses.replace(entry, kernel_key=full)


def _device(tmp_path: Path, sm_count: int) -> Installation:
    store = Store(tmp_path)
    return Installation(sku=B200, store=store, mode="strict", trace=[], trust=Trust(B200, store, None, {}),
                        tools=TOOLS, constants=Constants(sm_count, B200.l2_bytes))


@pytest.mark.parametrize("sm_count", [148, 152])
def test_consuming_kernel_loads_the_variant_for_the_device_value(tmp_path: Path, sm_count: int) -> None:
    store = Store(tmp_path)
    built = {n: _publish_consuming(store, n, f"kernel for {n} SMs".encode()) for n in (148, 152)}
    path = _device(tmp_path, sm_count).object_for("_flash_attn_fwd", KEY)
    assert path == store.object_path(built[sm_count].object_digest)


def test_consuming_kernel_without_the_device_value_names_the_constant_and_fix(tmp_path: Path) -> None:
    _publish_consuming(Store(tmp_path), 148, b"kernel for 148 SMs")
    with pytest.raises(KernelMissing) as info:
        _device(tmp_path, 160).object_for("_flash_attn_fwd", KEY)
    message = str(info.value)
    assert "sm_count = 160 (built: 148)" in message
    assert "fa4-aot skus --detect" in message and "fa4-aot build --sku NAME" in message


def test_kernel_that_consumed_nothing_loads_on_any_device_of_the_arch(tmp_path: Path) -> None:
    entry = _publish(Store(tmp_path), KEY, b"shared")
    other = Installation(sku=SKU, store=Store(tmp_path), mode="strict", trace=[], tools=TOOLS,
                         trust=Trust(SKU, Store(tmp_path), None, {}), constants=Constants(60, 31457280))
    assert other.object_for("_flash_attn_fwd", KEY) == Store(tmp_path).object_path(entry.object_digest)


def test_a_miss_over_a_store_built_by_another_toolchain_names_the_difference(tmp_path: Path) -> None:
    # the H100's first certification of a default store built on a CPU host: every kernel missed (9,230 checks)
    # because the build host had the CUDA-12 CuTe libraries installed too, and the miss said only "build it"
    store = Store(tmp_path)
    other = {**TOOLS, "nvidia-cutlass-dsl-libs-cu12": "4.8.1"}
    digest = store.put_object(b"kernel")
    store.put_entry(Entry(kernel_key=kernel_keys.kernel_key("_flash_attn_fwd", KEY, SKU, other), object_digest=digest,
                          size=6, family="_flash_attn_fwd", compile_key=kernel_keys.canonical(KEY), sku=SKU.name,
                          arch=SKU.arch, sm_count=SKU.sm_count, l2_bytes=SKU.l2_bytes, cuda_major=SKU.cuda_major,
                          toolchain=other, variant="t", call="c", compile_seconds=0.0, host=SKU.host))
    with pytest.raises(KernelMissing) as info:
        _installation(tmp_path, "strict").object_for("_flash_attn_fwd", KEY)
    message = str(info.value)
    assert "1 h200 kernel(s) built by another toolchain (nvidia-cutlass-dsl-libs-cu12 differs" in message, message
    assert "fa4-aot doctor" in message
