"""Certification checks only kernels the store holds (fa4_aot/certify/plan.py).

Found certifying the default h200 build on the H200 (2026-12-03, bench/default_certify-h200-2026-12-03-s15.json):
154 checks failed with KernelMissing on FA4's side, e.g. at "fwd seqused bf16 d=128 causal h=32:1 batch=26
seqlen_q=6 seqlen_k=7" and "fwd paged fp16 d=72 causal h=1:1 ... page_size=1". FA4 on fake tensors at those points
(the oracle) launches exactly the kernels their region names, so the lean runtime is right there; but the build
never compiled them. A build records regions over a signature's whole size space while it compiles a grid variant's
or a calls file's kernels at their sizes only (serve-decode, train, train-deterministic in the default matrix), and
a paged signature's kernels at its page size only: its page-size-1 regions name FA4's non-TMA kernel, which page
size 128 (FA4's tile) does not use. The certification drew points inside those regions anyway.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.certify import plan
from fa4_aot.compile.coverage_lean import Regions
from fa4_aot.domain.calls import Call
from fa4_aot.domain.recipe_format import call_sizes
from fa4_aot.domain.signature import Signature
from fa4_aot.matrix import variants
from fa4_aot.store import Store, recipes
from tests.conftest import TINY_VARIANTS, run_cli

SEQUSED = Signature("seqused", "fwd", "bf16", 128, 128, "causal", (0, 0), 0.0, False, 1, 32, 1, 0)
PAGED = Signature("paged", "fwd", "fp16", 72, 72, "causal", (0, 0), 0.0, False, 1, 8, 8, 128)
CASES = {  # (the call a build compiles: a grid point of serve-decode, a decode call; a point of the H200's failures)
    "seqused-32:1": (SEQUSED.call(1, 1, 1024), SEQUSED.call(26, 6, 7)),
    "paged-d72-page-1": (PAGED.call(1, 1, 1024), dataclasses.replace(PAGED, page_size=1).call(30, 1, 111)),
}


def build_calls(store: Path, *calls: Call, dry_run: bool = False) -> dict[str, Any]:
    """`fa4-aot build --calls` of exactly `calls` into `store` (planned only with `dry_run`): its JSON document."""
    path = store.parent / f"calls-{len(list(store.parent.iterdir()))}.jsonl"
    path.write_text("".join(json.dumps(c.to_dict()) + "\n" for c in calls))
    result = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--calls", str(path), "--json",
                     *(["--dry-run"] if dry_run else []), cache=store)
    assert result.returncode == 0, result.stderr[-2000:]
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@pytest.mark.parametrize("case", sorted(CASES))
def test_h200_default_certify_checks_no_kernel_the_store_lacks(case: str, tmp_path: Path) -> None:
    built_call, point_call = CASES[case]
    store_path = tmp_path / "store"
    build_calls(store_path, built_call)
    sku = variants.load(TINY_VARIANTS).sku("h200")
    store = Store(store_path)
    # the oracle: the kernels FA4's own dispatch (fake tensors) launches at the failing point; the build lacks them
    fa4_keys = build_calls(store_path, point_call, dry_run=True)["kernel_keys"]
    assert fa4_keys and all(store.get_entry(k) is None for k in fa4_keys)
    # the region holding there names exactly those: the lean runtime launches what FA4 launches (KernelMissing both)
    sig = Signature.of(point_call)
    region = recipes.find(Regions(store, sku).regions(sig), call_sizes(point_call))
    assert region is not None and [k.kernel_key for k in region.kernels] == fa4_keys
    # the certification checks what the store holds and says which regions it leaves out
    found = plan.plan(store, sku, plan.signatures_in(store, sku))
    assert found.checks
    assert all(store.get_entry(u.kernel_key) is not None for c in found.checks for u in c.kernels)
    assert any("lack" in line and fa4_keys[0][:16] in line for line in found.unreached), found.unreached
