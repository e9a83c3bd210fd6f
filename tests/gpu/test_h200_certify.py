"""Certification on a Hopper GPU (the SKU of the GPU present: h100-sxm, h200): `fa4-aot certify` finds FA4 4.0.0b36's
wrong dq at head dims 72 and 80 and its paged head-dim-160 crash, survives them, and passes the controls; then both
runtimes refuse those kernels with the reason while serving the rest, in one process each, with no CUDA error on the
way.

Needs the store of tests/data/certify_variants.toml in FA4_AOT_CACHE, built with the registry off for this GPU's
SKU (see that file). The test certifies a copy of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, copy_store
from tests.gpu.skus import present_sku

pytestmark = pytest.mark.gpu

VARIANTS = ROOT / "tests" / "data" / "certify_variants.toml"


def fa4_aot(store: Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fa4_aot", "--cache-dir", str(store), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def sku() -> str:
    return present_sku(VARIANTS)


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory, sku: str) -> tuple[Path, dict]:
    store = copy_store(Path(os.environ["FA4_AOT_CACHE"]), tmp_path_factory.mktemp("certify") / "store")
    result = fa4_aot(store, "certify", "--sku", sku, "--variants", str(VARIANTS), "--recheck-known-bad",
                     "--json", "-q", "-j", "4", "--deadline", "60")
    print(result.stderr[-3000:])
    assert result.returncode == 1, result.stderr[-3000:]  # kernels failed: said, not a failed run
    return store, json.loads(result.stdout)


def head_dims(store: Path, doc: dict) -> dict[str, tuple[str, str]]:
    """{kernel key: (status, the call that planned it)} of the run's verdicts."""
    from fa4_aot.store import Store

    s = Store(store)
    return {v["kernel_key"]: (v["status"], s.get_entry(v["kernel_key"]).call) for v in doc["verdicts"]}


def test_certify_finds_the_dq_bug_and_the_paged_crash(certified: tuple[Path, dict]) -> None:
    store, doc = certified
    found = head_dims(store, doc)
    print(json.dumps(doc["counts"]), *(f"{k[:12]} {s} {c}" for k, (s, c) in found.items()), sep="\n")
    wrong_dq = [v for v in doc["verdicts"] if v["status"] == "wrong" and v["tensor"] == "dq"]
    for d in ("d=72", "d=80"):
        assert any(d in " ".join(v["calls"]) for v in wrong_dq), (d, doc["counts"])
    crashed = [v for v in doc["verdicts"] if v["status"] in ("crash", "hang")]
    assert any("paged" in " ".join(v["calls"]) and "d=160" in " ".join(v["calls"]) for v in crashed), doc["counts"]
    for key, (status, call) in found.items():
        if " d=64 " in call or " d=128 " in call:
            assert status == "pass", (key, status, call)
    measured = {tuple(b["when"].items()) for b in doc["measured_known_bad"]}
    assert measured, "every failure adds a measured known-bad entry for the SKU"


def test_a_second_run_has_nothing_left_to_check(certified: tuple[Path, dict], sku: str) -> None:
    store, _doc = certified
    result = fa4_aot(store, "certify", "--sku", sku, "--variants", str(VARIANTS), "--json", "-q")
    doc = json.loads(result.stdout)
    assert doc["checks"] == 0 and doc["skipped"] > 0, doc


@pytest.mark.parametrize("runtime", ["fa4", "lean"])
def test_both_runtimes_refuse_the_bad_kernels_and_serve_the_rest(certified: tuple[Path, dict], runtime: str) -> None:
    store, _doc = certified
    found = calls(store, runtime)
    assert found["train-d64"] == "ok" and found["train-det-d64"] == "ok", found
    assert found["decode-paged-d128"] == "ok" and found["decode-paged-d128-again"] == "ok", found
    for case in ("train-d72", "train-d80"):
        assert found[case].startswith("refused:") and "dq" in found[case], found[case]
    assert found["decode-paged-d160"].startswith("refused:") and "illegal" in found["decode-paged-d160"], found


@pytest.mark.parametrize("runtime", ["fa4", "lean"])
def test_a_failed_verdict_alone_refuses_and_require_refuses_the_unchecked(certified: tuple[Path, dict],
                                                                          runtime: str, tmp_path: Path) -> None:
    """The verdict path on its own: a kernel the registry does not name, whose verdict says wrong, is refused; and
    under FA4_AOT_CERTIFIED=require a kernel without a verdict is refused where a certified one runs."""
    from fa4_aot.domain.devices import probe
    from fa4_aot.domain.verdicts import Verdict
    from fa4_aot.store import Store

    store = copy_store(certified[0], tmp_path / "store")
    s = Store(store)
    paged128 = [e for e in s.entries() if not e.is_signpost and "paged" in e.call and " d=128 " in e.call]
    device = probe().device_class
    assert paged128 and device is not None
    s.put_verdicts([Verdict(e.kernel_key, device.id, "wrong", detail="planted by the test", tensor="out",
                            error=1.0, bound=0.01) for e in paged128])
    found = calls(store, runtime)
    assert found["decode-paged-d128"].startswith("refused:") and "failed certification" in found["decode-paged-d128"]
    assert found["train-d64"] == "ok", found
    assert calls(store, runtime, {"FA4_AOT_CERTIFIED": "require"})["train-d64"] == "ok"  # certified: runs
    unchecked = calls(Path(os.environ["FA4_AOT_CACHE"]), runtime, {"FA4_AOT_CERTIFIED": "require"})
    assert unchecked["train-d64"].startswith("refused:") and "no certification" in unchecked["train-d64"]


def calls(store: Path, runtime: str, env: dict[str, str] | None = None) -> dict[str, str]:
    result = subprocess.run([sys.executable, "-m", "tests.gpu.certify_calls", runtime], capture_output=True,
                            text=True, timeout=900, cwd=ROOT,
                            env={**os.environ, "FA4_AOT_CACHE": str(store), "FA4_AOT_SKU": present_sku(VARIANTS),
                                 **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    print(runtime, json.dumps(found, indent=1))
    return found
