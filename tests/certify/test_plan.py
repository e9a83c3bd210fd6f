"""Planning certification checks (fa4_aot/certify/plan.py) over a real store: each check's sizes are held by the
region whose kernels it names (so the GPU run launches exactly those), every kernel of the regions is reached,
sizes stay within the reference's bounds, and --keys narrows the checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fa4_aot.certify import plan
from fa4_aot.certify.driver import signatures_of
from fa4_aot.compile.coverage_lean import Regions
from fa4_aot.compile.orchestrator import work_of
from fa4_aot.domain.recipe_format import HEADS
from fa4_aot.domain.region import KernelUse, Region
from fa4_aot.domain.signature import Signature
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


def test_h200_default_certify_huge_varlen_batches_are_not_planned() -> None:
    # The default h200 build's certification on the H200 (2026-12-03): 1,693 checks ran out of memory at points
    # MAX_WORK and MAX_ELEMENTS let through, e.g. these two (2,688 GiB and 624 GiB asked): FA4's varlen backward
    # keeps fp32 accumulators padded per sequence, batch x heads x tile rows, whatever total_q is
    import numpy as np

    from fa4_aot.certify import reference
    from fa4_aot.domain.signature import Signature

    def at(**sizes: int) -> dict[str, np.ndarray]:
        return {name: np.array([v]) for name, v in sizes.items()}

    def kept(sig: Signature, points: dict[str, np.ndarray]) -> bool:
        return bool((plan._within_bounds(sig, points) & (plan._memory(sig, points) <= plan.MAX_BYTES))[0])

    d64 = Signature("varlen", "bwd", "bf16", 64, 64, "causal", (0, 0), 0.0, False, 1, 14, 1)
    d128 = Signature("varlen", "bwd", "bf16", 128, 128, "causal", (0, 0), 0.0, False, 1, 13, 1)
    for sig, point in ((d64, at(batch=65534, max_seqlen_q=8, max_seqlen_k=224, total_q=1, total_k=176, heads_kv=96)),
                       (d128, at(batch=65536, max_seqlen_q=2, max_seqlen_k=3, total_q=1, total_k=22, heads_kv=24))):
        assert plan._memory(sig, point)[0] > plan.MAX_BYTES  # whatever else rules the point out
        assert not kept(sig, point)
    # a training call as a model makes it: 4 sequences of up to 512 tokens, GQA 32/8, head dim 128
    train = Signature("varlen", "bwd", "bf16", 128, 128, "causal", (0, 0), 0.0, False, 1, 32, 8)
    assert kept(train, at(batch=4, max_seqlen_q=512, max_seqlen_k=512, total_q=2048, total_k=2048, heads_kv=8))
    dense = Signature("dense", "bwd_det", "fp16", 128, 128, "full", (0, 0), 0.0, False, 1, 16, 16)
    assert kept(dense, at(batch=2, seqlen_q=1024, seqlen_k=1024, heads_kv=16))
    assert plan.SCORE_BLOCK == reference.CHUNK_ELEMENTS


def _region(*guards: list[Any]) -> Region:
    """A region holding where every guard holds, launching one stand-in kernel."""
    return Region(format=1, signature={}, guards=list(guards), inputs={}, tensors=0, meta=(), fwd=(), bwd=(),
                  outputs={}, kernels=(KernelUse("FlashAttentionForwardSm90", None, "ab" * 32),), softmax_scale=1.0)


def _sym(name: str) -> list[str]:
    return ["sym", name]


PAGED = Signature("paged", "fwd", "bf16", 128, 128, "causal", (0, 0), 0.0, False, 1, 48, 8, 128)
VARLEN = Signature("varlen", "bwd", "bf16", 128, 128, "causal", (0, 0), 0.0, False, 1, 8, 8, 0)
DOMAIN = [  # (signature, point, in the callers' domain)
    (PAGED, {"batch": 68, "seqlen_q": 29, "num_pages": 7, "pages_per_seq": 257, "max_seqlen_q": 29,
             "max_seqlen_k": 2}, False),  # the H200's illegal address: a cache shorter than its queries
    (PAGED, {"batch": 68, "seqlen_q": 29, "num_pages": 7, "pages_per_seq": 257, "max_seqlen_q": 29,
             "max_seqlen_k": 29}, True),
    (PAGED, {"batch": 8, "seqlen_q": 4, "num_pages": 64, "pages_per_seq": 8, "max_seqlen_q": 2,
             "max_seqlen_k": 128}, False),  # max_seqlen_q below the query tensor's length
    (dataclasses.replace(PAGED, layout="seqused", page_size=0),
     {"batch": 15, "seqlen_q": 4097, "seqlen_k": 5000, "max_seqlen_q": 4097, "max_seqlen_k": 159}, False),
    (VARLEN, {"batch": 453, "max_seqlen_q": 262142, "max_seqlen_k": 7, "total_q": 1, "total_k": 9}, False),
    (VARLEN, {"batch": 453, "max_seqlen_q": 1, "max_seqlen_k": 10, "total_q": 1, "total_k": 9}, False),
    (VARLEN, {"batch": 453, "max_seqlen_q": 1, "max_seqlen_k": 7, "total_q": 1, "total_k": 9}, True),
    (dataclasses.replace(VARLEN, layout="dense"), {"batch": 1, "seqlen_q": 1, "seqlen_k": 1048575}, True),
]


@pytest.mark.parametrize("sig,point,inside", DOMAIN)
def test_the_domain_is_the_callers(sig: Signature, point: dict[str, int], inside: bool) -> None:
    assert bool(plan.in_domain(sig, point)) is inside
    arrays = {name: np.array([value, value]) for name, value in point.items()}
    assert plan.in_domain(sig, arrays).tolist() == [inside, inside]


def _planned_outside(sig: Signature, outside: list[Any], tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[list[plan.Check], list[str]]:
    """The checks of two regions of `sig`: the first holding only outside the callers' domain, the second
    everywhere; (checks, unreached lines). The regions' stand-in kernel counts as built."""
    matrix = variants.load(TINY_VARIANTS)
    sku = matrix.sku("h200")
    regions = [_region(outside), _region()]
    held = plan._held_points(sig, sku, regions)
    assert 0 not in held and held[1] and all(plan.in_domain(sig, p) for p in held[1])
    unreached: list[str] = []
    resolver = plan._Resolver(Store(tmp_path / "store"), sku.constants())
    monkeypatch.setattr(resolver, "built", lambda key: True, raising=False)
    checks = plan._checks(sig, sku, regions, resolver, {}, None, plan.PER_KERNEL, "test", unreached)
    return checks, unreached


def test_h200_default_certify_paged_keys_cover_queries_in_the_plan(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Found certifying the default h200 build on the H200 (2026-12-03): the 12 illegal addresses were paged
    # checks whose max_seqlen_k was below seqlen_q (e.g. seqlen_q=29 max_seqlen_k=2), calls no serving engine
    # makes: the plan draws only points where each cache can hold its queries' keys, and says a region held only
    # elsewhere is unreached
    outside = ["lt", _sym("max_seqlen_k"), _sym("seqlen_q")]
    checks, unreached = _planned_outside(PAGED, outside, tmp_path, monkeypatch)
    assert checks and all(c.point["max_seqlen_k"] >= c.point["seqlen_q"] >= 1 for c in checks)
    assert any("region 0" in line and "callers' domain" in line for line in unreached)


def test_h200_default_certify_varlen_max_is_a_real_length_in_the_plan(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Found certifying the default h200 build on the H200 (2026-12-03): varlen checks such as batch=453
    # max_seqlen_q=262142 total_q=1 were planned; callers pass the longest sequence's length
    for outside in (["gt", _sym("max_seqlen_q"), _sym("total_q")], ["gt", _sym("max_seqlen_k"), _sym("total_k")]):
        checks, unreached = _planned_outside(VARLEN, outside, tmp_path, monkeypatch)
        assert checks and all(c.point["max_seqlen_q"] <= c.point["total_q"] for c in checks)
        assert all(c.point["max_seqlen_k"] <= c.point["total_k"] for c in checks)
        assert any("region 0" in line for line in unreached)


def test_paged_checks_draw_caches_whose_sequences_own_their_pages() -> None:
    """A serving engine's KV cache gives each sequence its own pages (a table as long as its longest sequence, a pool
    of batch x that many pages). The draws picked pool and table apart from batch and keys (30 sequences on a pool
    of one page, tables of 10,639 pages for 2 keys), so the plan seldom held a long decode cache over a real pool:
    now every other paged point is one, at every cache length the bounds allow."""
    sku = variants.load(TINY_VARIANTS).sku("h200")
    sig = dataclasses.replace(PAGED, page_size=16)
    (points,) = plan._held_points(sig, sku, [_region()]).values()
    own = [p for p in points if p["num_pages"] == p["batch"] * p["pages_per_seq"]
           and (p["pages_per_seq"] - 1) * 16 < p["max_seqlen_k"] <= p["pages_per_seq"] * 16]
    assert len(own) >= len(points) // 3, (len(own), len(points))
    assert any(p["seqlen_q"] <= 4 and p["max_seqlen_k"] >= 4096 for p in own), own


@pytest.mark.parametrize("page_size,head_dim,head_dim_v", [(16, 160, 160), (128, 128, 128), (1, 64, 64),
                                                         (64, 192, 128)])
def test_a_paged_signature_gets_one_wide_check_past_32_bit_offsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    page_size: int, head_dim: int,
                                                                    head_dim_v: int) -> None:
    """A serving engine's KV cache is most of its GPU; the ordinary checks keep every input below 2^28 elements, so
    an index of the pool held in 32 bits (vLLM's FlexAttention overflowed so, vllm-project/vllm#50427) was never
    reached. Each paged signature now gets one decode over a pool whose K and V each hold more than 2^31 elements,
    in the callers' domain, within the wide memory bound; other layouts none."""
    sig = dataclasses.replace(PAGED, page_size=page_size, head_dim=head_dim, head_dim_v=head_dim_v)
    checks, _unreached = _planned_outside(sig, ["lt", _sym("max_seqlen_k"), _sym("seqlen_q")], tmp_path, monkeypatch)
    (wide,) = [c for c in checks if c.kind == "wide"]
    p = wide.point
    pool = p["num_pages"] * page_size * p["heads_kv"]
    assert pool * head_dim > 2**31 and pool * head_dim_v > 2**31
    assert p["seqlen_q"] == p["max_seqlen_q"] == 1 <= p["max_seqlen_k"] <= p["pages_per_seq"] * page_size
    assert plan.in_domain(sig, p) and plan._memory(sig, {k: np.array([v]) for k, v in p.items()})[0] <= plan.WIDE_BYTES
    assert all(c.kind != "wide" for c in _planned_outside(VARLEN, ["gt", _sym("max_seqlen_q"), _sym("total_q")],
                                                          tmp_path, monkeypatch)[0])


def test_one_wide_check_per_kernel_set() -> None:
    """Paged signatures at other page sizes, or models of one GQA ratio, launch one kernel: one wide check for it."""
    def check(kind: str, key: str, label: str) -> plan.Check:
        return plan.Check(PAGED, {}, (plan.Use("FlashAttentionForwardSm90", key * 64),), kind, 1, label)

    checks = [check("wide", "a", "16"), check("small", "a", "16"), check("wide", "a", "128"), check("wide", "b", "64")]
    assert [(c.kind, c.label) for c in plan._one_wide_per_kernel_set(checks)] == [("wide", "16"), ("small", "16"),
                                                                                 ("wide", "64")]
