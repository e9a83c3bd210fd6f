"""The build driver fills zig's caches while its workers plan (fa4.warm_linker): a build's first link for a target
compiles zig's libc stubs and compiler_rt (about 20 CPU s), and every worker's first link waited on it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from fa4_aot import fa4
from fa4_aot.compile import orchestrator
from fa4_aot.errors import BuildError
from fa4_aot.fa4 import linking
from fa4_aot.matrix import variants
from fa4_aot.store import Store
from tests.conftest import TINY_VARIANTS

H200 = variants.load(TINY_VARIANTS).sku("h200")


def _warmed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dry_run: bool) -> list[Any]:
    hosts: list[Any] = []
    monkeypatch.setattr(fa4, "warm_linker", hosts.append)
    orchestrator.build_calls(H200, Store(tmp_path / "store"), [], jobs=1, dry_run=dry_run)
    assert not [t for t in threading.enumerate() if t.name == "fa4-aot-warm-linker"]  # joined by the build
    return hosts


def test_a_local_build_warms_the_linker_for_its_host_target(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    assert _warmed(monkeypatch, tmp_path, dry_run=False) == [H200.host_target]


def test_a_dry_run_links_nothing_and_warms_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _warmed(monkeypatch, tmp_path, dry_run=True) == []


def test_warming_fills_zigs_cache_and_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = tmp_path / "zig-global"
    monkeypatch.setenv("ZIG_GLOBAL_CACHE_DIR", str(cache))
    monkeypatch.setenv("ZIG_LOCAL_CACHE_DIR", str(tmp_path / "zig-local"))
    monkeypatch.setenv("FA4_AOT_HOST_LIBS", str(tmp_path / "host-libs"))
    linking._stand_ins.cache_clear()
    linking.warm(H200.host_target)
    assert any(p.is_file() for p in cache.rglob("*")), "zig's global cache is still empty"

    def no_zig() -> list[str]:
        raise BuildError("no zig here")

    monkeypatch.setattr(linking, "zig", no_zig)
    linking._stand_ins.cache_clear()
    linking.warm(H200.host_target)  # raises nothing: the real links report it, with the install command
    linking._stand_ins.cache_clear()
