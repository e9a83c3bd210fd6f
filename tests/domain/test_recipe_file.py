"""Issue 29, point 2: the compact recipe file (domain/recipe_file.py). It holds exactly the regions a JSON file
holds (every committed recording round-trips), builds write it, JSON files of earlier builds still read, and a
hostile compact file is refused with ValueError (inflation, nesting, indices) before any region is checked."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from fa4_aot import config
from fa4_aot.domain import kernel_keys, recipe_file
from fa4_aot.domain.region import Region, parse_regions
from fa4_aot.matrix import variants
from fa4_aot.store import Store, recipes
from tests.domain.test_recipe_bounds import refused_everywhere

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "store_h200_xeon"


def _committed() -> list[tuple[str, bytes]]:
    """(key, bytes) of every recipe file of the committed h200 store: JSON files of a build before issue 29."""
    return [(p.stem, p.read_bytes()) for p in sorted((COMMITTED / "recipes").glob("*/*.json"))]


def _target() -> dict[str, Any]:
    return variants.load(config.default_variants_file()).skus["h200"].target_facts()


def _packed(doc: dict[str, Any]) -> bytes:
    return recipe_file.MAGIC + zlib.compress(kernel_keys.dumps(doc).encode())


def test_compact_files_hold_exactly_the_regions_json_files_hold() -> None:
    for key, data in _committed():
        doc = json.loads(data)
        compact = recipe_file.encode(key, doc["regions"])
        assert recipe_file.is_compact(compact) and not recipe_file.is_compact(data)
        assert recipe_file.decode(compact) == doc == recipe_file.decode(data)
        assert [r.to_json() for r in parse_regions(recipe_file.decode(compact)["regions"])] == doc["regions"]
        assert recipe_file.encode(key, doc["regions"]) == compact  # the same regions, the same bytes
        recipes.check_file(compact, key, _target())


def test_regions_that_repeat_are_stored_once() -> None:
    """Ten regions differing only in a guard: the compact file stores their steps, metas and kernels once."""
    key, data = _committed()[0]
    region = json.loads(data)["regions"][0]
    many = [{**region, "guards": [*region["guards"], ["ge", ["sym", "batch"], i]]} for i in range(10)]
    one, ten = recipe_file.encode(key, many[:1]), recipe_file.encode(key, many)
    assert len(ten) < 2 * len(one) and len(ten) * 5 < len(json.dumps({"key": key, "regions": many}))
    parsed = parse_regions(recipe_file.decode(ten)["regions"])
    assert parsed[0].fwd is parsed[9].fwd and parsed[0].meta is parsed[9].meta  # decoded and typed once too
    assert [r.to_json() for r in parsed] == many


def test_builds_write_compact_files_and_json_files_still_load(tmp_path: Path) -> None:
    store = Store(tmp_path / "cache")
    key, data = _committed()[0]
    store.put_recipes(key, data)
    loaded = recipes.load(store, key)
    assert loaded and recipes.load(store, key)[0] is loaded[0]  # parsed once per process for the same bytes
    extra = Region.parse({**loaded[0].to_json(), "guards": [*loaded[0].guards, ["ge", ["sym", "batch"], 1]]})
    assert recipes.merge(store, key, [extra]) == len(loaded) + 1
    written = store.recipes(key)
    assert written is not None and recipe_file.is_compact(written)
    assert [r.to_json() for r in recipes.load(store, key)] == [*json.loads(data)["regions"], extra.to_json()]


HOSTILE = [  # (case, bytes under the committed file's key, what the error names)
    ("not zlib", lambda key: recipe_file.MAGIC + b"not deflate", "does not inflate"),
    ("truncated", lambda key: recipe_file.encode(key, [])[:-4], "truncated"),
    ("inflation bomb", lambda key: recipe_file.MAGIC + zlib.compress(b" " * (recipe_file.MAX_DECODED + 1)),
     "inflates past"),
    ("no tables", lambda key: _packed({"key": key, "regions": []}), "no tables"),
    ("index past a table", lambda key: _packed({"key": key, "tables": {t: [] for t in recipe_file.TABLES},
                                                "regions": [{"signature": 3}]}), "not an entry of table values"),
    ("bool as an index", lambda key: _packed({"key": key, "tables": {**{t: [] for t in recipe_file.TABLES},
                                                                     "lists": [[True]]},
                                              "regions": [{"fwd": 0}]}), "not a list of indices"),
    ("nested 50,000 deep", lambda key: recipe_file.MAGIC + zlib.compress(b"[" * 50_000 + b"]" * 50_000),
     "nested deeper than"),
]


@pytest.mark.parametrize("make,named", [(m, n) for _c, m, n in HOSTILE], ids=[c for c, _m, _n in HOSTILE])
def test_hostile_compact_files_are_refused(tmp_path: Path, make: Any, named: str) -> None:
    key, _data = _committed()[0]
    refused_everywhere(tmp_path, key, make(key), named)


def _nested(depth: int, inner: str = "0") -> str:
    """`inner` inside an object inside lists: `depth` levels of brackets around it."""
    return '{"a": ' + "[" * (depth - 1) + inner + "]" * (depth - 1) + "}"


_MAX = recipe_file.MAX_DEPTH
DEPTHS = [  # (case, JSON text of an object): brackets in strings, escaped quotes and backslashes, near the bound
    ("well inside", _nested(16), False),
    ("at the bound", _nested(_MAX), False),
    ("two past it", _nested(_MAX + 2), True),
    ("brackets in a string", _nested(_MAX, '"' + "[" * 300 + '"'), False),
    ("closers in a string", _nested(_MAX + 2, '"' + "]" * 300 + '"'), True),
    ("escaped quote then brackets", _nested(_MAX + 2, '"\\"[[["'), True),
    ("escaped backslash before a quote", _nested(_MAX + 2, '["\\\\", "\\\\\\""]'), True),
    ("escapes hiding no bracket", _nested(_MAX, '"\\\\\\"]]]\\n\\u005d"'), False),
    ("adjacent strings around a bracket", _nested(_MAX, '{"a[": "b", "c": "d"}'), False),
    # a string a scan could take to run on (an escaped backslash before its quote), the depth after it
    ("depth after an escaped backslash", _nested(_MAX + 2).replace("{", '{"s": "\\\\", ', 1), True),
    ("depth after escaped quotes", _nested(_MAX + 2).replace("{", '{"s": "\\"\\\\\\"", ', 1), True),
]


@pytest.mark.parametrize("text,deep", [(t, d) for _c, t, d in DEPTHS], ids=[c for c, _t, _d in DEPTHS])
@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32-le"])
def test_nesting_bound_is_the_pre_scans_for_every_file_json_parses(text: str, deep: bool, encoding: str) -> None:
    """The depth bound (MAX_DEPTH, D38) is now checked after json parses a file, in about a third of the time of
    the pre-scan it replaces (recipe_file._valid_depth): it refuses exactly the files the pre-scan refused
    (_check_depth, still applied to files json refuses), whatever their strings hold, and in every encoding json
    reads (the pre-scan read UTF-16 and UTF-32 bytes as if UTF-8)."""
    json.loads(text)
    scanned = text.encode()
    try:
        recipe_file._check_depth(scanned)
    except ValueError:
        assert deep
    else:
        assert not deep
    data = text.encode(encoding)
    if deep:
        with pytest.raises(ValueError, match="nested deeper than"):
            recipe_file.decode(data)
    else:
        assert recipe_file.decode(data) == json.loads(text)


def test_malformed_and_deep_file_is_refused_for_its_depth_as_before() -> None:
    """json parses first now; a file it refuses that also nests past MAX_DEPTH is refused for its depth, as when
    the depth was checked before parsing, and one nested past json's own limit never raises RecursionError."""
    for data in (b"[" * 200 + b"x" + b"]" * 200, b"[" * 50_000, b"[" * 50_000 + b"]" * 50_000):
        with pytest.raises(ValueError, match="nested deeper than"):
            recipe_file.decode(data)
    with pytest.raises(ValueError, match="not JSON"):
        recipe_file.decode(b"[" * 20 + b"x" + b"]" * 20)
