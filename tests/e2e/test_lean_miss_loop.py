"""The lean miss loop (issue 17, point 3): a lean runtime's miss is recorded with its call, locally (the store's
misses/, `fa4-aot misses`; FA4_AOT_RECORD) and, with a server, on the server (test_builder.py); then
`fa4-aot build --from-misses` closes it: kernels, libraries and recipe regions, so that a strict re-run serves
every call with 0 misses, and the coverage judge of the lean runtime agrees.

Regression: a lean miss was recorded nowhere (only FA4's fallback mode recorded misses), so the loop that closes
FA4's misses could not close the lean runtime's. Real FA4 compiles on this CPU host; the lean runtime's decision
whether a call is served (its region, and every kernel of it in the store) is checked without launching.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa4_aot.domain import recipe_format
from fa4_aot.domain.calls import Call
from fa4_aot.domain.signature import Signature
from fa4_aot.errors import KernelMissing
from fa4_aot.matrix.variants import load
from fa4_aot.runtime import runner
from fa4_aot.store import Store
from tests.conftest import TINY_VARIANTS, run_cli

pytestmark = pytest.mark.slow
SKU = load(TINY_VARIANTS).skus["h200"]
BASE = {"layout": "dense", "pass_": "fwd", "dtype": "bf16", "head_dim": 64, "head_dim_v": 64, "mask": "full",
        "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 2, "seqlen_q": 256,
        "seqlen_k": 256, "heads_q": 4, "heads_kv": 2, "page_size": 0}
CALLS = [Call.from_dict(BASE), Call.from_dict({**BASE, "mask": "causal", "seqlen_q": 100, "seqlen_k": 300})]


def lean_misses(cache: Path) -> list[str]:
    """Run CALLS through a strict lean runtime over `cache` (no server) as far as launching; the calls missed."""
    rt = runner.Runtime(Store(cache), SKU)
    missed = []
    for call in CALLS:
        attn = rt.attention(Signature.of(call))
        sizes = attn.sizes(recipe_format.sizes_of_call(call.layout, call.batch, call.seqlen_q, call.seqlen_k))
        try:
            region = attn.region(sizes)
        except KernelMissing:
            missed.append(call.describe())
            continue
        assert all(rt.store.has_entry(k.kernel_key) for k in region.kernels), call.describe()
    return missed


def test_lean_misses_are_recorded_and_build_from_misses_closes_them(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cache, calls = tmp_path / "store", tmp_path / "calls.jsonl"
    monkeypatch.setenv("FA4_AOT_RECORD", str(calls))
    assert lean_misses(cache) == [c.describe() for c in CALLS]
    listed = run_cli("misses", "--json", cache=cache)
    assert listed.returncode == 0, listed.stderr
    misses = json.loads(listed.stdout)
    assert sorted(m["call"]["mask"] for m in misses) == ["causal", "full"]
    assert {m["family"] for m in misses} == {"recipe"}
    assert {Call.from_dict(json.loads(line)) for line in calls.read_text().splitlines()} == set(CALLS)

    judged = run_cli("coverage", "--sku", "h200", "--calls", str(calls), "--runtime", "lean", "--variants",
                     str(TINY_VARIANTS), "--json", cache=cache)
    assert json.loads(judged.stdout)["served"] == 0, judged.stderr[-2000:]

    built = run_cli("build", "--from-misses", "--variants", str(TINY_VARIANTS), "--json", "-j", "1", cache=cache)
    assert built.returncode == 0, built.stderr[-3000:] + built.stdout[-3000:]
    report = json.loads(built.stdout)[0]
    assert report["failed"] == 0 and report["built"] >= 1 and report["recipes"] >= 2, report

    assert lean_misses(cache) == []  # the strict re-run: 0 misses
    judged = run_cli("coverage", "--sku", "h200", "--calls", str(calls), "--runtime", "lean", "--variants",
                     str(TINY_VARIANTS), "--json", cache=cache)
    assert json.loads(judged.stdout)["served"] == len(CALLS), judged.stdout[-2000:]
