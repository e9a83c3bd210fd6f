"""The seam's store-backed compile cache (fa4_aot.fa4.caches.StoreCache) over a fake KernelSource: it asks the
source once per key, caches what it loaded, reports FA4's own compiles, and lets the source's errors through.
It is a real FA4 JITCache subclass, so this imports FA4 (CPU is enough: nothing is launched)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fa4_aot import fa4
from fa4_aot.errors import KernelMissing


class FakeSource:
    def __init__(self, answer: Path | None | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, Any]] = []
        self.events: list[str] = []

    def object_for(self, family: str, key: Any) -> Path | None:
        self.asked.append((family, key))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def loaded(self, family: str, key: Any) -> None:
        self.events.append(f"loaded {family}")

    def compiled(self, family: str, key: Any) -> None:
        self.events.append(f"compiled {family}")


def test_a_miss_asks_the_source_and_a_compile_is_reported_and_kept() -> None:
    from flash_attn.cute.cache_utils import JITCache

    source = FakeSource(None)
    cache = fa4.store_cache("_flash_attn_fwd", source)
    assert isinstance(cache, JITCache)
    assert (1, "k") not in cache and source.asked == [("_flash_attn_fwd", (1, "k"))]
    compiled = object()
    cache[(1, "k")] = compiled  # what FA4 does after compiling
    assert source.events == ["compiled _flash_attn_fwd"]
    assert (1, "k") in cache and cache[(1, "k")] is compiled and len(source.asked) == 1  # not asked again


def test_the_sources_error_reaches_fa4_unchanged() -> None:
    missing = KernelMissing("absent", sku="h200", family="f", kernel_key="k", compile_key="c")
    cache = fa4.store_cache("_flash_attn_bwd", FakeSource(missing))
    with pytest.raises(KernelMissing, match="absent"):
        (2, "k") in cache  # noqa: B015  (the membership test is the call under test)


def test_an_object_that_does_not_load_is_not_counted_as_loaded(tmp_path: Path) -> None:
    bogus = tmp_path / "kernel.o"
    bogus.write_bytes(b"not an object file")
    source = FakeSource(bogus)
    with pytest.raises(Exception):  # noqa: B017  (CuTe's loader raises its own error types)
        (3, "k") in fa4.store_cache("_flash_attn_fwd", source)  # noqa: B015
    assert source.events == []


def test_every_fa4_compile_cache_family_is_found() -> None:
    from fa4_aot.fa4 import caches

    families = set(caches.fa4_functions())
    assert {"_flash_attn_fwd", "_flash_attn_bwd"} <= families
