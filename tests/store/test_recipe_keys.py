"""Issue 29: recipe keys name no value FA4 passes to its kernels at run time, and stores from before still read.

Format 3 files are keyed without the page size and the window (their regions hold them as sizes); format 2 files
(issue 17 to issue 29) are keyed by them and hold them as constants, format 1 files by the head counts too. A
store of each format is read under its own key: a format-2 file serves exactly its own page size and window, never
another (its regions were recorded there only), and a region of one format is refused under another's key."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fa4_aot import config
from fa4_aot.domain import recipe_format
from fa4_aot.domain.signature import Signature
from fa4_aot.matrix import variants
from fa4_aot.runtime import runner
from fa4_aot.store import Store, recipes

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "store_h200_xeon"
SKU = variants.load(config.default_variants_file()).skus["h200"]


def _region(**signature: Any) -> dict[str, Any]:
    """A real recorded region (the committed h200 store's, format 1) as format 2 with `signature` changes: a
    format-1 region guards no head count, so it is a format-2 region of the same signature as it is."""
    doc = json.loads(next(iter(sorted((COMMITTED / "recipes").glob("*/*.json")))).read_bytes())
    region = copy.deepcopy(doc["regions"][0])
    region["format"] = 2
    region["signature"].update(signature)
    return region


def _store(tmp_path: Path, key: str, region: dict[str, Any]) -> Store:
    store = Store(tmp_path / "cache")
    store.put_recipes(key, json.dumps({"key": key, "regions": [region]}).encode())
    return store


def _served(store: Store, sig: Signature, sizes: dict[str, int]) -> bool:
    attn = runner.Runtime(store, SKU, None, None).attention(sig)
    return recipes.find(attn.regions, attn.sizes(sizes)) is not None


@pytest.mark.parametrize("changes", [
    {"mask": "local", "window": [1023, 0]},
    {"mask": "local", "window": [511, 511]},
    {"layout": "dense", "mask": "causal"},
])
def test_format_2_file_serves_its_own_window_only(tmp_path: Path, changes: dict[str, Any]) -> None:
    region = _region(**changes)
    sig = Signature.from_dict(region["signature"])
    store = _store(tmp_path, recipes.recipe_key(sig, SKU, 2), region)
    sizes = {k: v for k, v in region["recorded_at"].items() if k in recipe_format.SIZE_NAMES["dense"]}
    assert _served(store, sig, sizes)
    if sig.mask == "local":  # another window: the format-2 region was recorded at this one only
        assert not _served(store, dataclasses.replace(sig, window=(4095, 0)), sizes)


def test_format_3_key_names_no_page_size_nor_window() -> None:
    base = Signature.from_dict({**_region()["signature"], "mask": "local", "window": [1023, 0]})
    same = [dataclasses.replace(base, window=(4095, 0)), dataclasses.replace(base, window=(0, 0)),
            dataclasses.replace(base, heads_q=base.heads_q * 2, heads_kv=base.heads_kv * 2)]
    assert {recipes.recipe_key(s, SKU) for s in same} == {recipes.recipe_key(base, SKU)}
    assert recipes.recipe_key(dataclasses.replace(base, mask="causal"), SKU) != recipes.recipe_key(base, SKU)
    paged = dataclasses.replace(base, layout="paged", page_size=16)
    assert recipes.recipe_key(dataclasses.replace(paged, page_size=1), SKU) == recipes.recipe_key(paged, SKU)
    # format 2 keys still name them (the files of stores built before)
    assert recipes.recipe_key(same[0], SKU, 2) != recipes.recipe_key(base, SKU, 2)


def test_region_of_one_format_refused_under_another_formats_key() -> None:
    region = _region(mask="local", window=[1023, 0])
    sig = Signature.from_dict(region["signature"])
    data = {2: json.dumps({"key": recipes.recipe_key(sig, SKU), "regions": [region]}).encode()}
    with pytest.raises(ValueError, match="do not hash"):
        recipes.check_file(data[2], recipes.recipe_key(sig, SKU), SKU.target_facts())
    recipes.check_file(json.dumps({"key": recipes.recipe_key(sig, SKU, 2), "regions": [region]}).encode(),
                       recipes.recipe_key(sig, SKU, 2), SKU.target_facts())
    # a format-2 region cannot name the sizes format 3 added
    region["guards"].append(["ge", ["sym", "window_left"], 0])
    with pytest.raises(ValueError, match="size 'window_left' is not one of"):
        recipe_format.check_region(region)


def test_migrate_recipes_files_format_2_regions_under_todays_keys_pinned(tmp_path: Path) -> None:
    from fa4_aot.store.migrate import migrate_recipes

    region = _region(mask="local", window=[1023, 0])
    sig = Signature.from_dict(region["signature"])
    store = _store(tmp_path, recipes.recipe_key(sig, SKU, 2), region)
    assert recipes.load(store, recipes.recipe_key(sig, SKU)) == []
    assert migrate_recipes(store, [SKU], dry_run=True) == 1
    assert recipes.load(store, recipes.recipe_key(sig, SKU)) == []
    assert migrate_recipes(store, [SKU]) == 1
    migrate_recipes(store, [SKU])  # idempotent: the file holds the region once
    (moved,) = recipes.load(store, recipes.recipe_key(sig, SKU))
    assert moved.format == recipe_format.RECIPE_FORMAT
    sizes = {k: v for k, v in region["recorded_at"].items() if k in recipe_format.SIZE_NAMES["dense"]}
    assert moved.holds({**sizes, **recipe_format.bound_sizes(sig)})
    other = dataclasses.replace(sig, window=(4095, 0))  # one file now, but the region was recorded at (1023, 0)
    assert recipes.recipe_key(other, SKU) == recipes.recipe_key(sig, SKU)
    assert not moved.holds({**sizes, **recipe_format.bound_sizes(other)})


SOURCES = [  # (case, signature changes): the passes and layouts whose files differ in what their keys name
    ("training, deterministic", {"pass_": "bwd_det"}),
    ("forward with LSE, served by training files too", {"pass_": "fwd_lse"}),
    ("paged decode with a window", {"pass_": "fwd", "layout": "paged", "page_size": 64, "mask": "local",
                                    "window": (128, 0)}),
]


@pytest.mark.parametrize("changes", [c for _case, c in SOURCES], ids=[case for case, _c in SOURCES])
def test_sources_are_each_pass_files_of_every_format_in_order(changes: dict[str, Any]) -> None:
    """sources() makes each pass's signature document once (issue 29: a new signature's first call pays for it);
    its keys are still recipe_key's of formats 3 and 2 and legacy_key's, pass by pass, the served passes' forward
    only."""
    sig = dataclasses.replace(Signature.from_dict(_region()["signature"]), **changes)
    expected: dict[str, bool] = {}
    for pass_ in (sig.pass_, *recipes._SERVED_BY.get(sig.pass_, ())):
        other = dataclasses.replace(sig, pass_=pass_)
        for key in (recipes.recipe_key(other, SKU), recipes.recipe_key(other, SKU, 2), recipes.legacy_key(other, SKU)):
            expected.setdefault(key, pass_ != sig.pass_)
    assert recipes.sources(sig, SKU) == [recipes.Source(k, f) for k, f in expected.items()]
    assert len(expected) == 3 * (1 + len(recipes._SERVED_BY.get(sig.pass_, ())))
