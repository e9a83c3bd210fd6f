"""recipe_space: the size space a build explores, and the vectorised guard evaluation it judges regions with."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fa4_aot.domain import recipe_format, recipe_space, symexpr
from fa4_aot.domain.signature import Signature
from fa4_aot.domain.skus import Sku

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
SIG = Signature(layout="dense", pass_="fwd", dtype="bf16", head_dim=128, head_dim_v=128, mask="causal",
                window=(0, 0), softcap=0.0, sink=False, num_splits=0, heads_q=32, heads_kv=8)
S = ["sym", "seqlen_q"]
K = ["sym", "seqlen_k"]
B = ["sym", "batch"]
H = ["sym", recipe_format.HEADS]
# guards of the forms FA4's recordings hold (fa4/record.py): size-1 tests, tile edges, the split heuristic
GUARDS = [
    ["ne", B, 1], ["eq", B, 1], ["gt", ["mul", 4, S], 128], ["le", ["mul", 4, S], 128],
    ["ne", ["floordiv", ["add", 127, K], 128], 1],
    ["le", ["floordiv", 132, ["mul", H, ["floordiv", ["add", 127, ["mul", 4, S]], 128]]], 128],
    ["ge", ["floordiv", ["add", 127, K], 128], ["floordiv", 132, ["mul", B, H]]],
    ["eq", ["floordiv", 132, ["mul", B, ["floordiv", ["add", 127, ["mul", 4, S]], 128]]], 16],
    ["lt", S, ["mul", 4, S, H]], ["ne", ["mod", K, 64], 0], ["or", ["gt", B, 256], ["eq", ["max", S, K], K]],
    ["not", ["ge", ["min", S, K], 2]], ["gt", ["floordiv", 132, ["add", B, -3]], 4],  # a division by zero at b=3
]


@pytest.mark.parametrize("layout", list(recipe_format.SIZE_NAMES))
def test_draws_lie_in_the_space_and_name_every_size(layout: str) -> None:
    sig = Signature(**{**SIG.to_dict(), "layout": layout, "page_size": 16 if layout == "paged" else 0,
                       "window": (0, 0)})
    sp = recipe_space.space(sig, SKU)
    assert set(sp.names) == set(recipe_format.SIZE_NAMES[layout])
    points = recipe_space.draw(sp, np.random.default_rng(1), 5000)
    assert set(points) == {*recipe_format.SIZE_NAMES[layout], recipe_format.HEADS}
    # the sizes the signature fixes (a paged call's page size; a local window's sides) at its values: pinned
    fixed = set(recipe_space.pinned(dict(points), sig)) - set(points)
    assert fixed == ({recipe_format.PAGE_SIZE} if layout == "paged" else set())
    assert fixed <= set(recipe_format.size_names(layout))
    heads = points[recipe_format.HEADS]
    assert (heads == 8).mean() > 0.4 and set(heads) == {1, 8}  # split-KV: own and 1
    plain = recipe_space.draw(recipe_space.space(dataclasses.replace(sig, num_splits=1), SKU),
                              np.random.default_rng(1), 5000)
    assert set(plain[recipe_format.HEADS]) == set(recipe_space.HEAD_COUNTS)
    for size in sp.sizes:
        values = points[size.name]
        assert values.min() >= size.low and values.max() <= size.high
        if size.upper is not None:
            assert (values <= size.upper(points)).all()
    if layout == "dense":  # the whole range, not just near the probes: long sequences and big batches too
        assert points["seqlen_k"].max() > 500_000 and points["seqlen_q"].max() > 100_000
        assert points["batch"].max() > 10_000 and (points["batch"] == 1).any()


def test_covered_agrees_with_symexpr_at_every_point() -> None:
    sp = recipe_space.space(SIG, SKU)
    points = recipe_space.draw(sp, np.random.default_rng(2), 3000, {"batch": [3]})
    rng = np.random.default_rng(3)
    for _ in range(40):
        guards = [GUARDS[i] for i in rng.choice(len(GUARDS), size=rng.integers(1, 4), replace=False)]
        found = recipe_space.covered(guards, points)
        for i in range(0, 3000, 7):
            at = recipe_space.point(points, i)
            try:
                expected = symexpr.holds(guards, at)
            except ValueError:  # a division by zero: such a region does not hold there
                expected = False
            assert bool(found[i]) == expected, (guards, at)


def test_constants_include_where_a_scaled_guard_turns() -> None:
    found = recipe_space.constants([["gt", ["mul", 4, S], 128]])
    assert {31, 32, 33, 34, 128, 129} <= found  # 4 * seqlen_q > 128 turns between 32 and 33


def test_compiled_guards_in_region_lookup_agree_with_symexpr() -> None:
    from fa4_aot.domain.region import Region
    from fa4_aot.store import recipes

    def region(guards: list) -> Region:
        return Region(format=2, signature={}, guards=guards, inputs={}, tensors=0, meta=(), fwd=(), bwd=(),
                      outputs={}, kernels=(), softmax_scale=1.0)

    sp = recipe_space.space(dataclasses.replace(SIG, num_splits=1), SKU)
    points = recipe_space.draw(sp, np.random.default_rng(4), 2000, {"batch": [3]})
    rng = np.random.default_rng(5)
    regions = [region([GUARDS[i] for i in rng.choice(len(GUARDS), size=rng.integers(1, 4), replace=False)])
               for _ in range(30)] + [region([["eq", ["pow", B, 2], ["mul", B, B]], ["gt", ["frac", 1, 2], 0]])]
    for i in range(2000):
        at = recipe_space.point(points, i)

        def holds(guards: list, at: dict = at) -> bool:
            try:
                return symexpr.holds(guards, at)
            except ValueError:
                return False

        expected = next((r for r in regions if holds(r.guards)), None)
        found = recipes.find(list(regions), at)
        assert (found is None) == (expected is None) and (found is None or holds(found.guards)), at
