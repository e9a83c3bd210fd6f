"""Issue 29, part 2: the lean runtime checks a region's steps when a call first selects it, not every region of its
recipe file at first read (store.recipes.load_lazy). What still holds: every guard is admitted before any is
evaluated (a guard bomb refuses the file at first read, D37), a region runs only once recipe_format admitted all
of it, a malformed region is refused with the error the whole file's load gave, and readers of every region
(recipes.load) still check them all."""

from __future__ import annotations

import copy
import json
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from fa4_aot import config
from fa4_aot.domain import kernel_keys, recipe_file, symexpr
from fa4_aot.domain.region import lazy_regions, parse_regions
from fa4_aot.domain.signature import Signature
from fa4_aot.errors import StoreError
from fa4_aot.matrix import variants
from fa4_aot.runtime import runner
from fa4_aot.store import Store, recipes

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "store_h200_xeon"
FOREIGN_STEP = {"op": "load_library.__call__.__call__", "args": ["/tmp/anything.so"], "kwargs": {"kw": {}},
                "out": [0], "tuple": False}
BOMB = ["gt", ["mul", *[1 << 62] * 60_000], 1]  # D37: a product of 60,000 copies of 2**62
SPLIT = 1000  # region 0 holds at seqlen_q <= SPLIT, region 1 above


def _two_regions(tmp_path: Path, change: Any) -> tuple[Store, str, dict[str, Any]]:
    """A store holding the committed training file as two regions split at seqlen_q SPLIT, the second one
    edited by `change(region)`: (store, key, document)."""
    found = [(p.stem, json.loads(p.read_bytes())) for p in sorted((COMMITTED / "recipes").glob("*/*.json"))]
    key, doc = max(found, key=lambda kd: len(kd[1]["regions"][0]["bwd"]))
    first = doc["regions"][0]
    second = copy.deepcopy(first)
    first["guards"] = [*first["guards"], ["le", ["sym", "seqlen_q"], SPLIT]]
    second["guards"] = [*second["guards"], ["gt", ["sym", "seqlen_q"], SPLIT]]
    change(second)
    doc["regions"] = [first, second]
    store = Store(tmp_path / "cache")
    store.put_recipes(key, json.dumps(doc).encode())
    return store, key, doc


def _attention(store: Store, doc: dict[str, Any]) -> runner.Attention:
    sku = variants.load(config.default_variants_file()).skus["h200"]
    runtime = runner.Runtime(store, sku, None, None)  # no trust policy: a build host's own store, loaded as is
    return runtime.attention(Signature.from_dict(doc["regions"][0]["signature"]))


def _sizes(attn: runner.Attention, seqlen: int) -> dict[str, int]:
    return attn.sizes({"batch": 1, "seqlen_q": seqlen, "seqlen_k": seqlen})


def _load_error(store: Store, key: str, doc: dict[str, Any]) -> str:
    """The StoreError a load of the whole file gave before regions were checked at first use."""
    with pytest.raises(ValueError) as info:
        parse_regions(doc["regions"])
    return (f"recipe file {key} in {store.root} is refused: {info.value}; rerun `fa4-aot build` (it rewrites the "
            "file) or pull it again from a server that holds a good one")


def test_region_never_selected_does_not_stop_the_others(tmp_path: Path) -> None:
    store, _key, doc = _two_regions(tmp_path, lambda r: r["fwd"].insert(0, FOREIGN_STEP))
    attn = _attention(store, doc)
    for seqlen in (512, 200, SPLIT):
        region = attn.region(_sizes(attn, seqlen))
        assert region.to_json() == doc["regions"][0]


def test_malformed_region_is_refused_when_selected_as_its_file_was(tmp_path: Path) -> None:
    store, key, doc = _two_regions(tmp_path, lambda r: r["fwd"].insert(0, FOREIGN_STEP))
    expected = _load_error(store, key, doc)
    assert "region 1: op 'load_library" in expected
    attn = _attention(store, doc)
    for _ in range(2):  # refused each time it is selected, never bound
        with pytest.raises(StoreError) as info:
            attn.bound(_sizes(attn, 2048), "cuda", None)
        assert str(info.value) == expected
    assert not attn._bound
    assert attn.region(_sizes(attn, 512)).to_json() == doc["regions"][0]  # the good region still serves
    with pytest.raises(StoreError) as info:  # a reader of every region refuses the file at once, as before
        recipes.load(store, key)
    assert str(info.value) == expected


def test_guard_bomb_is_refused_at_first_read_before_any_guard_runs(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A region's guards select it, so every guard of the file is admitted when the file is read: a bomb in a
    region no call would select still refuses the file, before any guard is evaluated or compiled."""
    store, key, doc = _two_regions(tmp_path, lambda r: r["guards"].append(BOMB))
    monkeypatch.setattr(recipes, "_holds", _never)
    started = time.perf_counter()
    with pytest.raises(StoreError) as info:
        _attention(store, doc)
    assert time.perf_counter() - started < 2.0
    assert "region 1: " in str(info.value) and "operands" in str(info.value)
    assert str(info.value) == _load_error(store, key, doc)


def test_first_region_refused_is_named_whichever_part_refuses_it(tmp_path: Path) -> None:
    """A file whose region 0 has a foreign step and region 1 a bad guard: refused at first read (a guard), naming
    region 0 as the whole file's check always did."""
    store, key, doc = _two_regions(tmp_path, lambda r: r["guards"].append(BOMB))
    doc["regions"][0]["fwd"].insert(0, FOREIGN_STEP)
    store.put_recipes(key, json.dumps(doc).encode())
    expected = _load_error(store, key, doc)
    assert "region 0: op 'load_library" in expected
    with pytest.raises(StoreError) as info:
        _attention(store, doc)
    assert str(info.value) == expected


def test_a_region_is_checked_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parse cache by digest holds checked regions: a second runtime (or reader) of the same bytes gets the same
    Region without checking it again."""
    from fa4_aot.domain import region as region_module

    store, key, doc = _two_regions(tmp_path, lambda r: None)
    attn = _attention(store, doc)
    first = attn.region(_sizes(attn, 512))
    monkeypatch.setattr(region_module, "check_region", _never)
    again = _attention(store, doc)
    assert again.region(_sizes(again, 512)) is first
    monkeypatch.undo()
    assert recipes.load(store, key)[0] is first


def _compact(store: Store, key: str, doc: dict[str, Any], change: Any) -> bytes:
    """`doc` written as a compact file, its packed document edited by `change(packed)`, under `key`: the bytes."""
    data = recipe_file.encode(key, doc["regions"])
    packed = json.loads(zlib.decompress(data[len(recipe_file.MAGIC):]))
    change(packed)
    data = recipe_file.MAGIC + zlib.compress(json.dumps(packed).encode())
    store.put_recipes(key, data)
    return data


def _decode_error(store: Store, key: str, data: bytes) -> str:
    """The StoreError a load gave when the whole file was unpacked at first read."""
    with pytest.raises(ValueError) as info:
        recipe_file.decode(data)
    return f"unreadable recipe file {key} in {store.root}: {info.value}; rerun `fa4-aot build` (it rewrites the file)"


def test_compact_region_is_unpacked_when_selected_and_refused_as_its_file_was(tmp_path: Path) -> None:
    """Issue 29: a compact file's regions are unpacked from its tables when a call first selects them (their
    guards at first read). A region whose steps name an index past the tables no longer refuses the whole file at
    first read: the other region serves, and selecting it raises the StoreError the whole file's read raised."""
    store, key, doc = _two_regions(tmp_path, lambda r: None)
    data = _compact(store, key, doc, lambda packed: packed["regions"][1].update(fwd=10**6))
    expected = _decode_error(store, key, data)
    assert "region 1: fwd names 1000000, not an entry of table lists" in expected
    attn = _attention(store, doc)
    assert attn.region(_sizes(attn, 512)).to_json() == doc["regions"][0]
    for _ in range(2):  # refused each time it is selected, never bound
        with pytest.raises(StoreError) as info:
            attn.bound(_sizes(attn, 2048), "cuda", None)
        assert str(info.value) == expected
    assert not attn._bound
    with pytest.raises(StoreError) as info:  # a reader of every region refuses the file at once, as before
        recipes.load(store, key)
    assert str(info.value) == expected


def test_compact_file_refused_at_first_read_names_what_its_whole_read_named(tmp_path: Path) -> None:
    """A compact file refused at first read (here region 1's guards) is refused for the fault the whole file's
    read found first: region 0's index past a table, which is otherwise left for its selection."""
    store, key, doc = _two_regions(tmp_path, lambda r: r["guards"].append(BOMB))
    data = _compact(store, key, doc, lambda packed: packed["regions"][0].update(bwd=-1))
    expected = _decode_error(store, key, data)
    assert "region 0: bwd names -1" in expected
    with pytest.raises(StoreError) as info:
        _attention(store, doc)
    assert str(info.value) == expected


def test_a_guard_regions_share_is_checked_once_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compact file stores each distinct guard once and its regions share it: the first read checks each
    distinct guard once (symexpr.check), however many regions hold it, and every region's guards are admitted."""
    store, key, doc = _two_regions(tmp_path, lambda r: None)
    checked: list[str] = []
    real = symexpr.check

    def counted(expr: Any, names: Any, depth: int = 0) -> None:
        checked.append(kernel_keys.dumps(expr))
        real(expr, names, depth)

    monkeypatch.setattr(symexpr, "check", counted)
    regions = lazy_regions(recipe_file.read(recipe_file.encode(key, doc["regions"]))["regions"])
    distinct = {kernel_keys.dumps(g) for r in doc["regions"] for g in r["guards"]}
    assert sorted(checked) == sorted(distinct)
    assert len(distinct) < sum(len(r["guards"]) for r in doc["regions"])  # shared: fewer checks than guards
    assert [r.guards for r in regions] == [r["guards"] for r in doc["regions"]]


def test_a_shared_guard_admitted_for_one_region_is_refused_for_another(tmp_path: Path) -> None:
    """A guard is admitted over its region's size names: one the file stores once may be good for a format-3
    region and name a size a format-1 region lacks. Checked once per set of size names, the second region still
    refuses the file at first read, as the whole file's load refused it."""
    shared = ["ge", ["sym", "heads_kv"], 1]

    def format_1(region: dict[str, Any]) -> None:
        region.update(format=1, guards=[*region["guards"], shared])

    store, key, doc = _two_regions(tmp_path, format_1)
    doc["regions"][0].update(format=3, guards=[*doc["regions"][0]["guards"], shared])
    expected = _load_error(store, key, doc)
    assert "region 1: size 'heads_kv' is not one of" in expected
    for data in (json.dumps(doc).encode(), recipe_file.encode(key, doc["regions"])):
        store.put_recipes(key, data)
        recipes._parsed.clear()
        with pytest.raises(StoreError) as info:
            recipes.load_lazy(store, key)
        assert str(info.value) == expected


def _never(*args: Any) -> Any:
    raise AssertionError("called")
