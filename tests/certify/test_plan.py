"""Planning certification checks (fa4_aot/certify/plan.py) over a real store: each check's sizes are held by the
region whose kernels it names (so the GPU run launches exactly those), every kernel of the regions is reached,
sizes stay within the reference's bounds, and --keys narrows the checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4_aot.certify import plan
from fa4_aot.certify.driver import signatures_of
from fa4_aot.compile.coverage_lean import Regions
from fa4_aot.compile.orchestrator import work_of
from fa4_aot.domain.recipe_format import HEADS
from fa4_aot.matrix import variants
from fa4_aot.store import Store, recipes
from tests.conftest import TINY_VARIANTS


def planned(store_path: Path, keys: set[str] | None = None) -> tuple[plan.Plan, Regions]:
    matrix = variants.load(TINY_VARIANTS)
    sku = matrix.sku("h200")
    items = signatures_of(work_of(matrix, sku, matrix.select(["full-fwd"])))
    store = Store(store_path)
    return plan.plan(store, sku, items, keys=keys), Regions(store, sku)


def test_checks_launch_what_their_region_names(tiny_h200_full_fwd: Path) -> None:
    found, regions = planned(tiny_h200_full_fwd)
    assert found.checks
    for check in found.checks:
        region = recipes.find(regions.regions(check.sig), {**check.point})
        assert region is not None, check.describe()
        assert [k.kernel_key for k in region.kernels] == [u.kernel_key for u in check.kernels]
        heads_q = check.point[HEADS] * check.sig.heads_q // check.sig.heads_kv
        work = check.point["batch"] * check.point["seqlen_q"] * check.point["seqlen_k"] * heads_q * 128
        assert work <= plan.MAX_WORK


def test_every_kernel_of_the_regions_is_checked_or_said_unreached(tiny_h200_full_fwd: Path) -> None:
    found, regions = planned(tiny_h200_full_fwd)
    named = {k.kernel_key for c in found.checks for r in regions.regions(c.sig) for k in r.kernels}
    assert named <= found.kernels() or found.unreached
    store = Store(tiny_h200_full_fwd)
    assert {e.kernel_key for e in store.entries() if not e.is_signpost} <= found.kernels()
    per_kernel = {k: sum(k in {u.kernel_key for u in c.kernels} for c in found.checks) for k in found.kernels()}
    assert min(per_kernel.values()) >= plan.PER_KERNEL
    assert "typical" in {c.kind for c in found.checks}


def test_keys_narrow_the_checks(tiny_h200_full_fwd: Path) -> None:
    everything, _ = planned(tiny_h200_full_fwd)
    key = sorted(everything.kernels())[0]
    narrowed, _ = planned(tiny_h200_full_fwd, keys={key})
    assert narrowed.checks and all(key in {u.kernel_key for u in c.kernels} for c in narrowed.checks)
    none, _ = planned(tiny_h200_full_fwd, keys={"0" * 64})
    assert none.checks == []


def test_a_check_round_trips(tiny_h200_full_fwd: Path) -> None:
    found, _ = planned(tiny_h200_full_fwd)
    for check in found.checks:
        assert plan.Check.from_dict(check.to_dict()) == check


def test_the_store_names_the_signatures_it_recorded(tiny_h200_full_fwd: Path) -> None:
    matrix = variants.load(TINY_VARIANTS)
    sku = matrix.sku("h200")
    store = Store(tiny_h200_full_fwd)
    built = {sig for _label, sig in signatures_of(work_of(matrix, sku, matrix.select(["full-fwd"])))}
    found = plan.signatures_in(store, sku)
    assert {(s.layout, s.pass_, s.head_dim, s.mask) for _l, s in found} == \
        {(s.layout, s.pass_, s.head_dim, s.mask) for s in built}
    key = next(iter(plan.plan(store, sku, found).kernels()))
    assert plan.signatures_in(store, sku, {key}) == found
    assert plan.signatures_in(store, sku, {"0" * 64}) == []
    assert plan.signatures_in(store, matrix.sku("b200")) == []  # another SKU's files are not read as its own


def test_bounds_keep_only_valid_cheap_calls() -> None:
    import numpy as np

    from fa4_aot.domain.signature import Signature

    paged = Signature("paged", "fwd", "bf16", 128, 128, "causal", (0, 0), 0.0, False, 1, 32, 8, 16)
    points = {"batch": np.array([8, 8, 8, 1 << 16]), "seqlen_q": np.array([4, 4, 1, 1]),
              "max_seqlen_q": np.array([4, 2, 1, 1]), "num_pages": np.array([64, 64, 64, 1 << 22]),
              "pages_per_seq": np.array([8, 8, 8, 1 << 16]), "max_seqlen_k": np.array([128, 128, 128, 1 << 20]),
              HEADS: np.array([8, 8, 8, 8])}
    # max_seqlen_q below the query's length is not a valid call; the last point's pool and work are too large
    assert plan._within_bounds(paged, points).tolist() == [True, False, True, False]


def test_h200_default_build_kernel_in_fewer_regions_than_its_checks_is_planned(tiny_h200_full_fwd: Path) -> None:
    # Found certifying the default h200 build on the H200 (2026-12-03): a kernel held in fewer regions than its
    # checks took the small/boundary/large pass, which put the drawn points (dicts) in a set: TypeError, and no
    # round of `fa4-aot certify` over that store planned anything
    matrix = variants.load(TINY_VARIANTS)
    sku = matrix.sku("h200")
    store = Store(tiny_h200_full_fwd)
    items = signatures_of(work_of(matrix, sku, matrix.select(["full-fwd"])))
    many = plan.plan(store, sku, items, per_kernel=10)
    assert {"small", "large"} <= {c.kind for c in many.checks}
    points = [(c.sig, sorted(c.point.items())) for c in many.checks]
    assert len(points) == len(set(map(str, points)))  # no size checked twice


def test_typical_checks_are_bounded_per_kernel_not_per_region(tiny_h200_full_fwd: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # the default h200 build holds 31 regions a kernel: a typical check of every region took hours on the H200
    found, _ = planned(tiny_h200_full_fwd)
    typical = [c for c in found.checks if c.kind == "typical"]
    assert 0 < len(typical) <= plan.TYPICAL_PER_KERNEL * len(found.kernels())
    monkeypatch.setattr(plan, "TYPICAL_PER_KERNEL", 0, raising=False)  # the bound decides, not the region count
    bounded, _ = planned(tiny_h200_full_fwd)
    assert [c for c in bounded.checks if c.kind == "typical"] == []
    assert {"small", "large"} <= {c.kind for c in bounded.checks}
