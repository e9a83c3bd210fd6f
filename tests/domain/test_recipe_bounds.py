"""Issue 28, D37 and D38: what recipe_format admits must be cheap to evaluate and runnable by replay.bind, and a
recipe file cannot exhaust the parser. Each case is refused where the file is checked (the server's upload check,
store.recipes.check_file, and the client's load) with an error naming what is wrong, before any of it runs."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fa4_aot import config
from fa4_aot.domain import recipe_format, symexpr
from fa4_aot.domain.region import Region
from fa4_aot.errors import StoreError
from fa4_aot.matrix import variants
from fa4_aot.store import Store, recipes

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "store_h200_xeon"


def _training_file() -> tuple[str, dict[str, Any]]:
    """(key, document) of the committed h200 recipe file whose first region has a backward (real FA4 recordings)."""
    found = [(p.stem, json.loads(p.read_bytes())) for p in sorted((COMMITTED / "recipes").glob("*/*.json"))]
    return max(found, key=lambda kd: len(kd[1]["regions"][0]["bwd"]))


def _target() -> dict[str, Any]:
    return variants.load(config.default_variants_file()).skus["h200"].target_facts()


def refused_everywhere(tmp_path: Path, key: str, data: bytes, named: str) -> None:
    """`data` under `key` is refused by the server's check and by the client's load, both naming `named`."""
    with pytest.raises(ValueError, match=named):
        recipes.check_file(data, key, _target())
    store = Store(tmp_path / "cache")
    store.put_recipes(key, data)
    with pytest.raises(StoreError, match=named):
        recipes.load(store, key)


BOMB = ["gt", ["mul", *[1 << 62] * 60_000], 1]  # a product of 60,000 copies of 2**62: 19-27 s a lookup before


def test_d37_guard_product_bomb_is_refused_at_check(tmp_path: Path) -> None:
    """The 60,000-operand product passed recipe_format (every literal within 2**62, nesting 2): the server kept
    the file and every lookup of the signature multiplied out a 3.7-million-bit number. The check now bounds an
    expression's size, so the server refuses the upload (422) and a client refuses the file."""
    key, doc = _training_file()
    doc["regions"][0]["guards"].append(BOMB)
    refused_everywhere(tmp_path, key, json.dumps(doc).encode(), "operands")


def test_d37_compiled_guards_are_bounded_as_evaluate_is() -> None:
    """store.recipes.find compiles guards; the compiled mul and add had no magnitude bound, so a region whose
    guard is past 2**62 held there while symexpr.evaluate refuses it. Now the compiled form refuses (the region
    does not hold) exactly where evaluate does."""
    key, doc = _training_file()
    region = Region.parse(doc["regions"][0])
    sizes = {**dict(region.recorded_at or {}), recipe_format.HEADS: 1}
    assert recipes.find([region], sizes) is region
    for guard in (["gt", ["mul", 1 << 62, 1 << 62, 1 << 62], 1], ["gt", ["add", 1 << 62, 1 << 62], 1],
                  ["gt", ["mul", ["sym", "batch"], 1 << 62, 2], 1]):
        with pytest.raises(ValueError, match="past"):
            symexpr.evaluate(guard, sizes)
        bombed = dataclasses.replace(region, guards=[*region.guards, guard])
        assert recipes.find([bombed], sizes) is None, guard


def _drop(part: str, name: str) -> Any:
    return lambda r: r[part].pop(name)


D38 = [  # (case, change to a real training region, what the error names)
    ("no out output", _drop("outputs", "out"), "outputs name no 'out'"),
    ("out output None", lambda r: r["outputs"].update(out=None), "outputs name no 'out'"),
    ("no lse output", _drop("outputs", "lse"), "outputs name no 'lse'"),
    ("backward without dout", _drop("inputs", "dout"), "backward steps but no 'dout' input"),
    ("backward without dq", _drop("outputs", "dq"), "backward steps but no 'dq' output"),
    ("no q input", _drop("inputs", "q"), "inputs name no 'q'"),
]


@pytest.mark.parametrize("change,named", [(c, n) for _case, c, n in D38], ids=[c for c, _, _ in D38])
def test_d38_region_bind_cannot_run_is_refused(tmp_path: Path, change: Any, named: str) -> None:
    """Regions recipe_format admitted crashed the runtime with a KeyError in replay.bind (no out or lse output)
    or in the backward (no dout input, no dq output). The format now refuses them, naming the region."""
    key, doc = _training_file()
    region = doc["regions"][0]
    recipe_format.check_region(copy.deepcopy(region))
    change(region)
    with pytest.raises(ValueError, match=named):
        recipe_format.check_region(region)
    refused_everywhere(tmp_path, key, json.dumps(doc).encode(), f"region 0: {named}")


def test_d38_deeply_nested_file_is_refused(tmp_path: Path) -> None:
    """A recipe file nested 50,000 deep raised RecursionError out of the client's load (and anything recursing
    over a parsed document could). Parsing now bounds the depth and refuses the file as any other bad file."""
    key, _doc = _training_file()
    deep = b"[" * 50_000 + b"]" * 50_000
    data = b'{"key": "' + key.encode() + b'", "regions": [' + deep + b"]}"
    refused_everywhere(tmp_path, key, data, "nested deeper than")
    signature = {"layout": "dense", "deep": json.loads("[" * 500 + "]" * 500)}  # within json's own recursion
    doc = {"key": key, "regions": [{"signature": signature}]}
    refused_everywhere(tmp_path, key, json.dumps(doc).encode(), "nested deeper than")
