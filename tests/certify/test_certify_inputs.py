"""certify.inputs: random inputs at a point of a signature's size space, with exactly that point's sizes as FA4's
interface reads them, and keyword arguments both FA4 and the lean runtime take."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fa4_aot.certify.inputs import Inputs, _split, make_inputs
from fa4_aot.certify.plan import in_domain
from fa4_aot.domain import recipe_space
from fa4_aot.domain.signature import Signature
from fa4_aot.domain.skus import Sku
from fa4_aot.runtime import api

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
BASE = Signature(layout="dense", pass_="fwd", dtype="bf16", head_dim=32, head_dim_v=16, mask="causal",
                 window=(0, 0), softcap=0.0, sink=False, num_splits=1, heads_q=6, heads_kv=2)
LAYOUTS = {"dense": 0, "varlen": 0, "seqused": 0, "paged": 16}


def sig_of(layout: str, **changes: Any) -> Signature:
    return dataclasses.replace(BASE, layout=layout, page_size=LAYOUTS[layout], **changes)


def small_points(sig: Signature, count: int = 30) -> list[dict[str, int]]:
    """Points recipe_space draws for `sig` in the callers' domain, those whose tensors and attention are small
    enough for a CPU test."""
    points = recipe_space.draw(recipe_space.space(sig, SKU), np.random.default_rng(7), 20000)
    found = []
    for i in range(len(points["batch"])):
        p = recipe_space.point(points, i)
        if not in_domain(sig, p):
            continue
        rows = max(p.get("total_q", p["batch"] * p.get("seqlen_q", 1)), p.get("total_k", 0),
                   p["batch"] * p.get("seqlen_k", 1), p.get("num_pages", 0) * sig.page_size)
        if rows * p["heads_kv"] <= 20000 and p["batch"] * p.get("pages_per_seq", 1) <= 20000:
            found.append(p)
    return found[:count]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inputs_have_every_size_of_the_point(layout: str) -> None:
    sig = sig_of(layout)
    points = small_points(sig)
    assert len(points) >= 20  # the draw reached small points: the test checks something
    for n, point in enumerate(points):
        inputs = make_inputs(sig, point, seed=n, device="cpu")
        heads_q = 3 * point["heads_kv"]
        check = {"dense": _dense, "varlen": _varlen, "seqused": _seqused, "paged": _paged}[layout]
        check(inputs, point, heads_q, sig)


def _qkv(inputs: Inputs, q_rows: tuple[int, ...], k_rows: tuple[int, ...], heads_q: int, heads_kv: int) -> None:
    t = inputs.tensors
    assert t["q"].shape == (*q_rows, heads_q, 32) and t["q"].dtype == torch.bfloat16
    assert t["k"].shape == (*k_rows, heads_kv, 32)
    assert t["v"].shape == (*k_rows, heads_kv, 16)


def _dense(inputs: Inputs, p: dict[str, int], heads_q: int, sig: Signature) -> None:
    _qkv(inputs, (p["batch"], p["seqlen_q"]), (p["batch"], p["seqlen_k"]), heads_q, p["heads_kv"])
    assert set(inputs.tensors) == {"q", "k", "v"}


def _lengths(cu: torch.Tensor, batch: int, total: int, most: int) -> None:
    assert cu.dtype == torch.int32 and cu.shape == (batch + 1,)
    lengths = cu.long().diff()
    assert int(cu[0]) == 0 and int(cu[-1]) == total and int(lengths.min()) >= 0
    assert int(lengths.max()) == (most if total >= most else int(lengths.max())) <= most


def _varlen(inputs: Inputs, p: dict[str, int], heads_q: int, sig: Signature) -> None:
    _qkv(inputs, (p["total_q"],), (p["total_k"],), heads_q, p["heads_kv"])
    _lengths(inputs.tensors["cu_seqlens_q"], p["batch"], p["total_q"], p["max_seqlen_q"])
    _lengths(inputs.tensors["cu_seqlens_k"], p["batch"], p["total_k"], p["max_seqlen_k"])
    assert (inputs.options["max_seqlen_q"], inputs.options["max_seqlen_k"]) == (p["max_seqlen_q"], p["max_seqlen_k"])


def _used(inputs: Inputs, p: dict[str, int]) -> None:
    used = inputs.tensors["seqused_k"]
    assert used.dtype == torch.int32 and used.shape == (p["batch"],)
    assert int(used.min()) >= p["seqlen_q"] >= 1 and int(used.max()) == p["max_seqlen_k"]
    assert (inputs.options["max_seqlen_q"], inputs.options["max_seqlen_k"]) == (p["max_seqlen_q"], p["max_seqlen_k"])


def _seqused(inputs: Inputs, p: dict[str, int], heads_q: int, sig: Signature) -> None:
    _qkv(inputs, (p["batch"], p["seqlen_q"]), (p["batch"], p["seqlen_k"]), heads_q, p["heads_kv"])
    _used(inputs, p)
    assert int(inputs.tensors["seqused_k"].max()) <= p["seqlen_k"]


def _paged(inputs: Inputs, p: dict[str, int], heads_q: int, sig: Signature) -> None:
    _qkv(inputs, (p["batch"], p["seqlen_q"]), (p["num_pages"], sig.page_size), heads_q, p["heads_kv"])
    _used(inputs, p)
    table = inputs.tensors["page_table"]
    assert table.dtype == torch.int32 and table.shape == (p["batch"], p["pages_per_seq"])
    assert 0 <= int(table.min()) and int(table.max()) < p["num_pages"]
    if p["num_pages"] >= p["pages_per_seq"]:  # distinct pages within a sequence
        assert all(len(set(row)) == len(row) for row in table.tolist())
    if p["num_pages"] >= table.numel():  # and across sequences when the pool has room
        assert len(set(table.flatten().tolist())) == table.numel()


@pytest.mark.parametrize("total,count,cap", [(10, 3, 4), (12, 3, 4), (3, 5, 4), (1, 1, 1), (7, 1, 9), (0, 4, 3),
                                             (100, 100, 1), (250, 40, 7), (9, 2, 5)])
def test_split_sums_and_reaches_the_max(total: int, count: int, cap: int) -> None:
    for seed in range(20):
        lengths = _split(total, count, cap, torch.Generator().manual_seed(seed))
        assert len(lengths) == count and int(lengths.sum()) == total
        assert int(lengths.min()) >= 0 and int(lengths.max()) <= cap
        if total >= cap:
            assert int(lengths.max()) == cap


def test_split_refuses_too_many_rows() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        _split(13, 3, 4, torch.Generator())


@pytest.mark.parametrize("layout,point,message", [
    ("seqused", {"batch": 2, "seqlen_q": 4, "seqlen_k": 8, "max_seqlen_q": 4, "max_seqlen_k": 9}, "max_seqlen_k"),
    ("paged", {"batch": 2, "seqlen_q": 4, "num_pages": 4, "pages_per_seq": 2, "max_seqlen_q": 5,
               "max_seqlen_k": 8}, "max_seqlen_q"),
    ("varlen", {"batch": 2, "total_q": 9, "total_k": 4, "max_seqlen_q": 4, "max_seqlen_k": 4}, "do not fit"),
])
def test_impossible_points_are_refused(layout: str, point: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_inputs(sig_of(layout), point, 0, "cpu")


POINTS = {"dense": {"batch": 2, "seqlen_q": 3, "seqlen_k": 5},
          "varlen": {"batch": 2, "total_q": 5, "total_k": 7, "max_seqlen_q": 3, "max_seqlen_k": 4},
          "seqused": {"batch": 2, "seqlen_q": 3, "seqlen_k": 5, "max_seqlen_q": 3, "max_seqlen_k": 4},
          "paged": {"batch": 2, "seqlen_q": 3, "num_pages": 5, "pages_per_seq": 2, "max_seqlen_q": 3,
                    "max_seqlen_k": 20}}
FLAGS = [  # (pass, mask, window) -> what the call says
    ("fwd", "causal", (0, 0), {"causal": True, "window_size": (None, None), "return_lse": False}),
    ("fwd_lse", "full", (5, 5), {"causal": False, "window_size": (None, None), "return_lse": True}),
    ("bwd_det", "local", (7, 0), {"causal": False, "window_size": (7, 0), "deterministic": True}),
    ("bwd", "local", (3, 2), {"causal": False, "window_size": (3, 2), "deterministic": False}),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_,mask,window,expected", FLAGS)
def test_flags_gradients_and_sink(layout: str, pass_: str, mask: str, window: tuple[int, int],
                                  expected: dict[str, Any]) -> None:
    sig = sig_of(layout, pass_=pass_, mask=mask, window=window, sink=True, softcap=8.0)
    inputs = make_inputs(sig, {**POINTS[layout], "heads_kv": 2}, 3, "cpu")
    kwargs = inputs.kwargs()
    assert {k: kwargs[k] for k in expected} == expected and kwargs["softcap"] == 8.0
    training = pass_ in ("bwd", "bwd_det")
    t = inputs.tensors
    assert [t[n].requires_grad for n in ("q", "k", "v", "learnable_sink")] == [training] * 4
    sink = t["learnable_sink"]  # FA4's planner records the sink in the inputs' dtype, one logit per query head
    assert sink.shape == (6,) and sink.dtype == torch.bfloat16
    assert (inputs.dout is not None) == training
    if training:
        assert inputs.dout is not None and inputs.dout.shape == (*t["q"].shape[:-1], 16)
    assert not {"q", "k", "v"} & set(kwargs)


def test_same_seed_same_inputs_other_seed_other_inputs() -> None:
    sig = sig_of("paged", sink=True)
    point = {**POINTS["paged"], "batch": 6, "num_pages": 30, "pages_per_seq": 3, "max_seqlen_k": 40}
    a, b, c = (make_inputs(sig, point, seed, "cpu") for seed in (1, 1, 2))
    assert all(torch.equal(a.tensors[n], b.tensors[n]) for n in a.tensors)
    assert not torch.equal(a.tensors["q"], c.tensors["q"])
    assert not torch.equal(a.tensors["page_table"], c.tensors["page_table"])


def test_cost_is_the_sum_over_sequences() -> None:
    sig = sig_of("varlen")
    inputs = make_inputs(sig, {**POINTS["varlen"], "heads_kv": 1}, 0, "cpu")
    lengths_q = inputs.tensors["cu_seqlens_q"].diff().tolist()
    lengths_k = inputs.tensors["cu_seqlens_k"].diff().tolist()
    assert inputs.cost() == sum(a * b for a, b in zip(lengths_q, lengths_k, strict=True)) * 3 * (32 + 16)
    dense = make_inputs(sig_of("dense"), POINTS["dense"], 0, "cpu")
    assert dense.cost() == 2 * 3 * 5 * 6 * 48


def _fa4_parameters(function: str) -> set[str]:
    spec = importlib.util.find_spec("flash_attn")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("FA4 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "cute" / "interface.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return {a.arg for a in node.args.args + node.args.kwonlyargs}
    raise AssertionError(f"FA4's interface has no {function}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_both_runtimes_take_every_argument_by_name(layout: str) -> None:
    """Every keyword the inputs give is a named parameter of FA4's public function and of the lean runtime's
    (not swallowed by the lean runtime's **extra, which refuses what it does not know)."""
    name = "flash_attn_func" if layout == "dense" else "flash_attn_varlen_func"
    sig = sig_of(layout, pass_="bwd", sink=True, mask="local", window=(4, 0))
    kwargs = make_inputs(sig, {**POINTS[layout], "heads_kv": 2}, 0, "cpu").kwargs()
    assert set(kwargs) <= _fa4_parameters(name)
    lean = inspect.signature(getattr(api, name)).parameters
    assert set(kwargs) <= {n for n, p in lean.items() if p.kind is not p.VAR_KEYWORD}
    inspect.signature(getattr(api, name)).bind(*(torch.empty(0),) * 3, **kwargs)


@pytest.mark.parametrize("point", [
    {"batch": 68, "seqlen_q": 29, "num_pages": 7, "pages_per_seq": 257, "max_seqlen_q": 29, "max_seqlen_k": 2,
     "heads_kv": 8},
    {"batch": 21, "seqlen_q": 2193, "num_pages": 40, "pages_per_seq": 2, "max_seqlen_q": 2193, "max_seqlen_k": 5,
     "heads_kv": 1},
])
def test_h200_default_certify_paged_keys_cover_queries(point: dict[str, int]) -> None:
    # Found certifying the default h200 build on the H200 (2026-12-03): all 12 illegal addresses were paged
    # forwards such as "fwd paged bf16 d=128 causal h=6:1 batch=68 seqlen_q=29 ... max_seqlen_k=2 page_size=128":
    # seqused_k was drawn from 0, so most sequences held fewer keys than queries (causal rows with no key, caches
    # with none), which no serving engine passes: each sequence's cache holds its new queries' keys
    sig = dataclasses.replace(sig_of("paged"), page_size=128)
    with pytest.raises(ValueError, match="seqlen_q"):
        make_inputs(sig, point, 0, "cpu")
    rows, keys = min(point["seqlen_q"], 40), min(point["pages_per_seq"] * 128, 200)
    inside = {**point, "seqlen_q": rows, "max_seqlen_q": rows, "max_seqlen_k": keys}
    for layout_sig, sizes in ((sig, inside), (sig_of("seqused"), {**inside, "seqlen_k": keys + 3})):
        for seed in range(5):
            used = make_inputs(layout_sig, sizes, seed, "cpu").tensors["seqused_k"]
            assert int(used.min()) >= rows and int(used.max()) == keys, (layout_sig.layout, seed)
    exact = {**point, "seqlen_q": 5, "max_seqlen_q": 5, "max_seqlen_k": 5}  # a cache of just its queries' keys
    assert make_inputs(sig, exact, 0, "cpu").tensors["seqused_k"].tolist() == [5] * point["batch"]


def test_h200_default_certify_varlen_max_is_a_real_length() -> None:
    # Found certifying the default h200 build on the H200 (2026-12-03): varlen checks such as batch=453
    # max_seqlen_q=262142 total_q=1 ran, a max_seqlen_q no sequence has (callers pass the longest one's length)
    sig = sig_of("varlen")
    point = {"batch": 453, "total_q": 1, "total_k": 600, "max_seqlen_q": 262142, "max_seqlen_k": 600}
    with pytest.raises(ValueError, match="max_seqlen_q"):
        make_inputs(sig, point, 0, "cpu")
    with pytest.raises(ValueError, match="max_seqlen_k"):
        make_inputs(sig, {**point, "max_seqlen_q": 1, "total_k": 3}, 0, "cpu")
    inputs = make_inputs(sig, {**point, "max_seqlen_q": 1, "heads_kv": 1}, 0, "cpu")
    assert int(inputs.tensors["cu_seqlens_k"].diff().max()) == 600
