"""The client's store-backed cache on a CPU: strict misses, fallback misses, integrity on load.

Keys here are plain tuples standing in for FA4 compile keys; what is under test is the cache's
contract (load from the store, verify first, strict raises with the fix, fallback records the miss).
Loading a real kernel needs a GPU: tests/gpu covers it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4_aot import keys
from fa4_aot.client import Installation, StoreCache
from fa4_aot.errors import IntegrityError, KernelMissing
from fa4_aot.skus import Sku
from fa4_aot.store import Entry, Store
from fa4_aot.trust import Trust

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
KEY = (True, 128, "bf16-ish", None)


def _installation(tmp_path: Path, mode: str) -> Installation:
    store = Store(tmp_path)
    return Installation(sku=SKU, store=store, mode=mode, trace=[], trust=Trust(SKU, store, None, {}))


def _publish(store: Store, key: tuple, data: bytes) -> Entry:
    digest = store.put_object(data)
    entry = Entry(kernel_key=keys.kernel_key("_flash_attn_fwd", key, SKU), object_digest=digest, size=len(data),
                  family="_flash_attn_fwd", compile_key=keys.canonical(key), sku=SKU.name, arch=SKU.arch,
                  sm_count=SKU.sm_count, l2_bytes=SKU.l2_bytes, cuda_major=SKU.cuda_major, toolchain=keys.toolchain(),
                  variant="t", call="c", compile_seconds=0.0)
    store.put_entry(entry)
    return entry


def test_strict_miss_names_sku_family_and_fix(tmp_path: Path) -> None:
    cache = StoreCache("_flash_attn_fwd", _installation(tmp_path, "strict"))
    with pytest.raises(KernelMissing) as info:
        KEY in cache  # noqa: B015  (the membership test is the call under test)
    message = str(info.value)
    assert "SKU h200" in message and "_flash_attn_fwd" in message
    assert "fa4-aot build --sku h200" in message and "variants.toml" in message
    assert info.value.kernel_key == keys.kernel_key("_flash_attn_fwd", KEY, SKU)
    assert not list(Store(tmp_path).misses())


def test_fallback_miss_is_recorded_and_compile_counted(tmp_path: Path) -> None:
    inst = _installation(tmp_path, "fallback")
    cache = StoreCache("_flash_attn_fwd", inst)
    assert KEY not in cache
    cache[KEY] = object()  # what FA4 does after compiling
    assert KEY in cache and inst.stats.compiled == 1
    [miss] = Store(tmp_path).misses()
    assert miss.kernel_key == keys.kernel_key("_flash_attn_fwd", KEY, SKU) and miss.sku == "h200"


def test_corrupt_object_is_refused_before_loading(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = _publish(store, KEY, b"\x7fELF not really a kernel")
    path = store.object_path(entry.object_digest)
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    path.write_bytes(bytes(data))
    cache = StoreCache("_flash_attn_fwd", _installation(tmp_path, "strict"))
    with pytest.raises(IntegrityError) as info:
        KEY in cache  # noqa: B015
    assert info.value.expected == entry.object_digest and info.value.source == str(path)
