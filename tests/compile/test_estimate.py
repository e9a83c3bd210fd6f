"""`build --dry-run` cost: seconds per kernel from the store's recorded compile times (median, same arch), else
the documented default; and the CLI prints kernels per variant and the estimate (planning only, no compile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa4_aot.compile import estimate
from fa4_aot.domain.skus import Sku
from fa4_aot.store import Entry, Store
from tests.conftest import proven, run_cli

H200 = Sku("h200", "sm_90a", 132, 62914560, 13)
B200 = Sku("b200", "sm_100a", 148, 132644864, 13)


def _fill(store: Store, arch: str, seconds: list[float]) -> None:
    for i, s in enumerate(seconds):
        data = f"{arch} kernel {i}".encode()
        digest = store.put_object(data)
        store.put_entry(proven(Entry(kernel_key="", object_digest=digest, size=len(data), family="_flash_attn_fwd",
                                     compile_key=[i], sku="x", arch=arch, sm_count=1, l2_bytes=1, cuda_major=13,
                                     toolchain={}, variant="v", call="c", compile_seconds=s)))


@pytest.mark.parametrize(("recorded", "sku", "per", "source"), [
    ({}, H200, 1.8, "default for sm_90a"),
    ({}, B200, 4.6, "default for sm_100a"),
    ({"sm_90a": [1.0, 2.0, 9.0, 3.0, 2.5]}, H200, 2.5, "median CPU seconds of 5 sm_90a kernels"),
    ({"sm_90a": [1.0, 2.0, 9.0, 3.0]}, H200, 1.8, "fewer than 5"),  # too few: default
    ({"sm_100a": [7.0] * 6, "sm_90a": [1.0] * 2}, H200, 1.8, "default for sm_90a"),  # other arch ignored
    ({"sm_100a": [7.0] * 6}, B200, 7.0, "median CPU seconds of 6 sm_100a kernels"),
])
def test_seconds_per_kernel(tmp_path: Path, recorded: dict[str, list[float]], sku: Sku, per: float,
                            source: str) -> None:
    store = Store(tmp_path)
    for arch, seconds in recorded.items():
        _fill(store, arch, seconds)
    got, why = estimate.seconds_per_kernel(store, sku)
    assert got == per and source in why


def test_estimate_divides_by_jobs_and_adds_worker_start(tmp_path: Path) -> None:
    e = estimate.estimate(100, Store(tmp_path), H200, jobs=2)
    assert e.seconds == pytest.approx(estimate.WORKER_START_SECONDS + 100 * 1.8 / 2)
    assert estimate.estimate(0, Store(tmp_path), H200, jobs=2).seconds == 0.0


def test_dry_run_prints_kernels_per_variant_and_estimate(tmp_path: Path) -> None:
    variants = tmp_path / "variants.toml"
    variants.write_text('[skus.h200]\narch = "sm_90a"\nsm_count = 132\nl2_bytes = 62914560\ncuda_major = 13\n\n'
                        '[[variants]]\nname = "complete"\npasses = ["fwd"]\nhead_dims = [128]\nheads = [32]\n'
                        'gqa = [4]\n\n[shapes.one]\nbatch = [1]\nseqlen_q = [512]\nheads = [32]\n\n'
                        '[[variants]]\nname = "grid"\nshapes = "one"\npasses = ["fwd"]\nhead_dims = [128]\n'
                        'gqa = [4]\n')
    result = run_cli("build", "--sku", "h200", "--variants", str(variants), "--dry-run", "--json",
                     cache=tmp_path / "store")
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout)
    # the grid point is one of the shapes the complete variant covers; the complete one holds more
    assert doc["variants"]["complete"] > doc["variants"]["grid"] >= 1
    assert doc["estimate"]["kernels"] == doc["planned"] == doc["variants"]["complete"]
    assert doc["estimate"]["seconds_per_kernel"] == 1.8 and doc["estimate"]["seconds"] > 0
    text = run_cli("build", "--sku", "h200", "--variants", str(variants), "--dry-run", cache=tmp_path / "store")
    assert "estimated build time" in text.stdout and "complete" in text.stdout and "to build" in text.stdout


def test_compile_seconds_are_cpu_seconds_not_wall_time() -> None:
    """Issue 22, point 9: estimates followed the load of the machine that built the store (4.6-6.1 s a kernel
    where an idle one takes 1.8), because entries recorded wall time. A wait (what another process's load costs
    a compile) now adds nothing to what the compile records."""
    import time

    from fa4_aot.fa4.caches import Compiler

    got: list[float] = []
    compiler = Compiler("f", {("f", "[1]")}, lambda _family, _key, _fn, seconds: got.append(seconds))
    assert (1,) not in compiler  # FA4 asks; the compile starts
    time.sleep(0.5)  # waiting for a CPU, as on a loaded build host
    compiler[(1,)] = object()
    assert len(got) == 1 and got[0] < 0.25
