"""The lean runtime after issue 13: a kernel that consumed SKU constants is filed under its base key (the
signpost, which holds the first build's object) and its full key; the lean runtime's libraries must come from
the build with the device's constants (matching.select's), never from the signpost of another SKU's build."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Constants
from fa4_aot.errors import KernelMissing
from fa4_aot.runtime.libraries import Libraries
from fa4_aot.store import Entry, Store

TOOLS = {"flash-attn-4": "t", "nvidia-cutlass-dsl": "t"}
L2 = 132644864


def _file(store: Store, sm_count: int | None) -> Entry:
    """File a kernel as build does: full key, and the base key when it consumed a constant and none is filed."""
    data = f"kernel for {sm_count} SMs".encode()
    entry = Entry(kernel_key="", object_digest=store.put_object(data), size=len(data), family="_flash_attn_fwd",
                  compile_key=[1, 2], sku="b200", arch="sm_100a", sm_count=sm_count or 148, l2_bytes=L2,
                  cuda_major=13, toolchain=TOOLS, variant="t", call="c", compile_seconds=0.0,
                  hardware_queries=[["sm_count", sm_count]] if sm_count else [],
                  shared_libs={"x86_64": {"digest": "0" * 64, "size": 1, "needs": {}}})
    base, full = kernel_keys.entry_keys(entry)
    store.put_entry(dataclasses.replace(entry, kernel_key=full))
    if not store.has_entry(base):
        store.put_entry(dataclasses.replace(entry, kernel_key=base))
    return dataclasses.replace(entry, kernel_key=full)


def _base(entry: Entry) -> str:
    return kernel_keys.entry_keys(entry)[0]


@pytest.mark.parametrize("sm_count", [148, 152])
def test_lean_libraries_come_from_the_build_with_the_device_constants(tmp_path: Path, sm_count: int) -> None:
    store = Store(tmp_path)
    built = {n: _file(store, n) for n in (148, 152)}  # 148 filed first: the base entry holds its object
    found, why = Libraries(store, "b200", Constants(sm_count, L2))._entry(_base(built[148]))
    assert why == "" and found is not None and found.object_digest == built[sm_count].object_digest


def test_lean_kernel_without_the_device_constants_names_them(tmp_path: Path) -> None:
    store = Store(tmp_path)
    base = _base(_file(store, 148))
    with pytest.raises(KernelMissing) as info:
        Libraries(store, "b200", Constants(160, L2)).function(base, "_flash_attn_fwd")
    assert "sm_count = 160 (built: 148)" in str(info.value)


def test_lean_kernel_that_consumed_nothing_serves_every_device(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = _file(store, None)
    found, why = Libraries(store, "b200", Constants(160, L2))._entry(entry.kernel_key)
    assert why == "" and found is not None and found.kernel_key == entry.kernel_key
