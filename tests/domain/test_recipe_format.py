"""Issue 18, D26: recipe files are data, not code. recipe_format admits what FA4's host path records (every region
of the committed h200 store passes) and nothing else: a step reaching any torch attribute, an argument that
makes torch look a name up, a slot or kernel outside the region, unbounded arithmetic. The client refuses such a
file when it loads it, before any step is bound, and the arithmetic itself is bounded."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from fa4_aot import config
from fa4_aot.domain import symexpr
from fa4_aot.domain.signature import Signature
from fa4_aot.errors import StoreError
from fa4_aot.matrix import variants
from fa4_aot.runtime import replay, runner
from fa4_aot.store import Store, recipes

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "store_h200_xeon"


def _committed() -> list[tuple[str, dict[str, Any]]]:
    """(key, document) of every recipe file of the committed h200 store (real recordings of FA4)."""
    return [(p.stem, json.loads(p.read_bytes())) for p in sorted((COMMITTED / "recipes").glob("*/*.json"))]


def _region() -> dict[str, Any]:
    """A real region with a forward and a backward (the bigger of the committed files)."""
    return copy.deepcopy(max((doc["regions"][0] for _k, doc in _committed()), key=lambda r: len(r["bwd"])))


def _store_with(tmp_path: Path, change: Any) -> tuple[Store, Signature]:
    """A copy of the committed recipe file whose region `change(region)` edited, in a store of its own."""
    key, doc = max(_committed(), key=lambda kd: len(kd[1]["regions"][0]["bwd"]))
    change(doc["regions"][0])
    store = Store(tmp_path / "cache")
    store.put_recipes(key, json.dumps(doc).encode())
    return store, Signature.from_dict(doc["regions"][0]["signature"])


def _runtime(store: Store) -> runner.Runtime:
    sku = variants.load(config.default_variants_file()).skus["h200"]
    return runner.Runtime(store, sku, None, None)  # no trust policy: a build host's own store, loaded as is


FOREIGN_STEP = {"op": "load_library.__call__.__call__", "args": ["/tmp/anything.so"], "kwargs": {"kw": {}},
                "out": [0], "tuple": False}


def test_d26_recipe_with_foreign_op_is_refused(tmp_path: Path) -> None:
    """A step whose op was `load_library.__call__.__call__` went through torch.ops and dlopened any path. The
    client now refuses the region when a call first selects it (the lean runtime checks a region's steps then:
    store.recipes.load_lazy), before any step exists as a callable; a reader of every region (recipes.load) when it
    loads the file."""
    store, sig = _store_with(tmp_path, lambda r: r["fwd"].insert(0, FOREIGN_STEP))
    attn = _runtime(store).attention(sig)
    key, doc = max(_committed(), key=lambda kd: len(kd[1]["regions"][0]["bwd"]))  # _store_with's file
    refused = r"refused: region 0: op 'load_library.__call__.__call__' is not one"
    with pytest.raises(StoreError, match=refused):
        attn.region(attn.sizes(doc["regions"][0]["recorded_at"]))
    with pytest.raises(StoreError, match=refused):
        recipes.load(store, key)
    with pytest.raises(ValueError, match="may not use"):  # and binding never resolves it either
        replay._aten(FOREIGN_STEP["op"])


def test_d26_guard_with_huge_power_is_refused_quickly(tmp_path: Path) -> None:
    """A guard ["pow", 10, 10**9] ran for over 15 s on every client that looked for a region."""
    store, sig = _store_with(tmp_path, lambda r: r["guards"].append(["gt", ["pow", 10, 10**9], 1]))
    started = time.perf_counter()
    with pytest.raises(StoreError, match="exponent 1000000000 is past 64"):
        _runtime(store).attention(sig)
    with pytest.raises(ValueError, match="exponent"):
        symexpr.evaluate(["pow", 10, 10**9], {})
    with pytest.raises(ValueError, match="past"):
        symexpr.evaluate(["mul", ["sym", "batch"], *[1 << 40] * 1000], {"batch": 3})
    assert time.perf_counter() - started < 1.0


def test_every_committed_recipe_region_is_admitted(tmp_path: Path) -> None:
    from fa4_aot.domain.region import parse_regions

    for _key, doc in _committed():
        assert [r.to_json() for r in parse_regions(doc["regions"])] == doc["regions"]
    store = Store(tmp_path / "cache")
    for key, doc in _committed():
        store.put_recipes(key, json.dumps(doc).encode())
    assert all(recipes.load(store, key) for key, _doc in _committed())


def _edit(path: tuple[Any, ...], value: Any) -> Any:
    def change(region: dict[str, Any]) -> None:
        where: Any = region
        for part in path[:-1]:
            where = where[part]
        where[path[-1]] = value
    return change


def _first_op(region: dict[str, Any]) -> int:
    return next(i for i, s in enumerate(region["fwd"]) if "op" in s)


REFUSED = [  # (case, change to a real region, what the error names)
    ("torch attribute as op", lambda r: r["fwd"].insert(0, FOREIGN_STEP), "op 'load_library"),
    ("aten op FA4 never issues", lambda r: r["fwd"][_first_op(r)].update(op="aten.index_put_.default"),
     "op 'aten.index_put_"),
    ("dtype naming a torch function", lambda r: r["meta"][0].__setitem__(2, {"dtype": "load"}), "'dtype'"),
    ("torch name that is not a format", lambda r: r["fwd"][_first_op(r)]["kwargs"]["kw"].update(
        memory_format={"torch": "ops"}), "'torch'"),
    ("keyword FA4 never passes", lambda r: r["fwd"][_first_op(r)]["kwargs"]["kw"].update(file=1), "not one a recipe"),
    ("string argument", lambda r: r["fwd"][_first_op(r)]["args"].append("libc.so.6"), "not one a recipe"),
    ("bare float argument", lambda r: r["fwd"][_first_op(r)]["args"].append(0.5), "not one a recipe"),
    ("slot past the region", lambda r: r["fwd"][_first_op(r)].update(out=[10**6]), "tensor slot 1000000"),
    ("launch of no kernel", lambda r: r["fwd"].append({"launch": 99, "args": []}), "launch of kernel 99"),
    ("unknown step fields", lambda r: r["fwd"].append({"launch": 0, "args": [], "call": "x"}), "neither"),
    ("deep arguments", lambda r: r["fwd"][_first_op(r)]["args"].append([[[[[[[[[1]]]]]]]]]), "nested deeper"),
    ("huge literal", lambda r: r["guards"].append(["gt", ["sym", "batch"], 1 << 70]), "past"),
    # arguments: what check_region's exact-type paths (the common int, list, slot) pass on to the full checks
    ("huge literal argument", lambda r: r["fwd"][_first_op(r)]["args"].append(-(1 << 70)), "past"),
    ("slot past the region in an argument", lambda r: r["fwd"][_first_op(r)]["args"].append({"t": 10**6}),
     "tensor slot 1000000"),
    ("negative slot", lambda r: r["fwd"][_first_op(r)]["args"].append({"t": -1}), "tensor slot -1"),
    ("slot that is a bool", lambda r: r["fwd"][_first_op(r)]["args"].append({"t": True}), "tensor slot True"),
    ("slot that is a float", lambda r: r["fwd"][_first_op(r)]["args"].append({"t": 1.0}), "tensor slot 1.0"),
    ("two tags in one argument", lambda r: r["fwd"][_first_op(r)]["args"].append({"t": 0, "e": 1}),
     "not one a recipe"),
    ("device that is not true", lambda r: r["fwd"][_first_op(r)]["args"].append({"device": 1}), "'device'"),
    ("input other than the scale", lambda r: r["fwd"][_first_op(r)]["args"].append({"in": "q"}), "'in'"),
    ("dtype that is not a name", lambda r: r["fwd"][_first_op(r)]["args"].append({"dtype": ["bfloat16"]}),
     "'dtype'"),
    ("deep slot", lambda r: r["fwd"][_first_op(r)]["args"].append([[[[[[[[{"t": 0}]]]]]]]]), "nested deeper"),
    ("huge literal in a shape", lambda r: r["meta"][0][0].append(1 << 63), "past"),
    ("pow with a computed exponent", lambda r: r["guards"].append(["gt", ["pow", 2, ["sym", "batch"]], 1]),
     "integer literal exponent"),
    ("unknown size", lambda r: r["guards"].append(["gt", ["sym", "__import__"], 1]), "size '__import__'"),
    ("unknown expression op", lambda r: r["guards"].append(["eval", 1]), "not a size expression"),
    ("deep expression", lambda r: r["guards"].append(_deep(100)), "nested deeper"),
    ("unknown region field", _edit(("code",), "x"), "unknown fields: code"),
    ("missing field", lambda r: r.pop("fwd"), "fields missing: fwd"),
    ("missing and unknown fields", lambda r: r.pop("fwd") and r.update(code="x"), "fields missing: fwd"),
    ("format that is a bool", _edit(("format",), True), "format True"),
    ("another format", _edit(("format",), 4), "format 4"),
    # format 1 (before issue 17) has no head-count size: its key names the head counts
    ("head count in a format-1 region", lambda r: r.update(format=1) or r["guards"].append(["ge", ["sym", "heads_kv"],
                                                                                            1]),
     "size 'heads_kv' is not one of"),
    ("too many tensors", _edit(("tensors",), 10**9), "tensors is not a count"),
    ("kernel key that is not hex", lambda r: r["kernels"][0].update(kernel_key="../x"), "a kernel is not"),
    ("infinite scale", _edit(("softmax_scale",), float("inf")), "softmax_scale"),
]


def _deep(n: int) -> Any:
    expr: Any = ["sym", "batch"]
    for _ in range(n):
        expr = ["add", expr, 1]
    return expr


@pytest.mark.parametrize("change,named", [(c, n) for _case, c, n in REFUSED], ids=[c for c, _, _ in REFUSED])
def test_recipe_format_refuses(change: Any, named: str) -> None:
    from fa4_aot.domain import recipe_format  # imported here: the D26 cases above fail, not error, on code without it

    region = _region()
    recipe_format.check_region(region)
    change(region)
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("[", r"\[")):
        recipe_format.check_region(region)


def test_server_check_applies_the_same_format() -> None:
    """store.recipes.check_file (the server's upload check, and the client's before storing a fetched file)."""
    key, doc = _committed()[0]
    region = doc["regions"][0]
    sku = variants.load(config.default_variants_file()).skus["h200"]
    recipes.check_file(json.dumps(doc).encode(), key, sku.target_facts())
    region["guards"].append(["gt", ["pow", 10, 10**9], 1])
    with pytest.raises(ValueError, match="exponent"):
        recipes.check_file(json.dumps(doc).encode(), key, sku.target_facts())


def test_a_freed_objects_id_in_the_memo_admits_no_later_list() -> None:
    """check_region's memo keys the objects it admitted by id. It also noted a list made for the call alone
    (the toolchain's), freed when the call returned: CPython hands that memory to the next list made, and a region
    unpacked later (the lean runtime unpacks a compact file's region when a call first selects it) found its
    foreign step "admitted already" and unchecked. The memo now keeps every object it names alive."""
    from fa4_aot.domain import recipe_format

    first = _region()
    for spares in range(8):  # lists freed after the toolchain's go to the first lists made: spares take them
        memo: dict[Any, Any] = {}
        recipe_format.check_region(first, memo)
        later = dict(first)
        kept = [[] for _ in range(spares)]
        later["fwd"] = [FOREIGN_STEP]
        with pytest.raises(ValueError, match="load_library"):
            recipe_format.check_region(later, memo)
        del kept


def test_a_freed_documents_id_gives_no_later_document_its_typed_value() -> None:
    """region._Shared builds each document object's typed value once, by id: a document freed and another made
    at its memory (a region a compact file unpacks at its first selection) got the first one's steps."""
    from fa4_aot.domain.region import _Shared

    for spares in range(8):
        shared = _Shared()
        assert shared.value(tuple, [1, 2]) == (1, 2)  # the list is freed when the call returns
        kept = tuple([] for _ in range(spares))
        assert shared.value(tuple, [3, 4]) == (3, 4)
        assert shared.values(str, [5]) == ("5",) and shared.values(str, [6]) == ("6",)
        del kept
