"""A [[variants]] entry of call features (passes, head dims, dtypes, masks, GQA ratios, layouts, head counts...):
the Variant value, its expansion into signatures and calls, and its parsing.

FA4's kernel choice also depends on batch and sequence lengths (q_stage, pack_gqa, split-KV, 2-CTA,
persistent scheduling). A variant without `shapes` is shape-complete: it expands into Signatures, and the
build plans every kernel FA4 can choose for them at any batch and sequence lengths (complete.py). A variant
with `shapes` is restricted to the points of that named grid (shapes.py): each point becomes one `Call`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..domain.calls import DTYPES, LAYOUTS, MASKS, PASSES, Call
from ..domain.signature import Signature
from ..domain.skus import ARCHS, Sku
from ..domain.tomlsrc import TomlSource
from .fields import Fail, choices, entry_fail, int_list, is_int
from .shapes import Shapes

VARIANT_FIELDS = {
    "name": None, "shapes": None, "passes": PASSES, "head_dims": None, "dtypes": DTYPES, "masks": MASKS,
    "window": None, "gqa": None, "softcap": None, "sink": None, "layouts": LAYOUTS, "num_splits": None,
    "heads": None, "heads_kv": None, "page_size": None, "archs": None, "description": None,
}
DEFAULTS: dict[str, Any] = {
    "dtypes": ["bf16"], "masks": ["causal"], "window": [1024, 0], "gqa": [1], "softcap": [0.0],
    "sink": [False], "layouts": ["dense"], "num_splits": [1], "page_size": 128, "archs": [], "description": "",
}


@dataclass(frozen=True)
class Variant:
    name: str
    shapes: str  # "" for a shape-complete variant
    passes: tuple[str, ...]
    head_dims: tuple[tuple[int, int], ...]
    dtypes: tuple[str, ...]
    masks: tuple[str, ...]
    window: tuple[int, int]
    gqa: tuple[int | str, ...]
    softcap: tuple[float, ...]
    sink: tuple[bool, ...]
    layouts: tuple[str, ...]
    num_splits: tuple[int, ...]
    archs: tuple[str, ...]
    description: str = ""
    heads: tuple[int, ...] = ()  # query head counts of a shape-complete variant
    heads_kv: tuple[int, ...] = ()  # or its KV head counts: each ratio r then runs r x heads_kv query heads
    page_size: int = 128  # page size of a shape-complete variant's paged layout

    def applies_to(self, sku: Sku) -> bool:
        return not self.archs or sku.arch in self.archs

    @property
    def complete(self) -> bool:
        """Shape-complete: every batch and sequence length, not the points of a grid."""
        return not self.shapes

    def signatures(self, heads: tuple[int, ...] = (), page_size: int = 0) -> list[Signature]:
        """Every signature of this variant (for a grid variant, pass the grid's heads and page size)."""
        out: dict[Signature, None] = {}
        for p, (d, dv), dt, m, r, sc, sk, lay, ns, (hq, hkv) in itertools.product(
            self.passes, self.head_dims, self.dtypes, self.masks, self.gqa, self.softcap, self.sink,
            self.layouts, self.num_splits, self._head_counts(heads),
        ):
            if lay == "paged" and p in ("bwd", "bwd_det"):
                continue  # FA4 has no paged backward; training variants list dense/varlen layouts
            q, kv = (hq, 1 if r == "mqa" else hq // int(r)) if hq else (int(r) * hkv, hkv)
            out[Signature(
                layout=lay, pass_=p, dtype=dt, head_dim=d, head_dim_v=dv, mask=m, window=self.window, softcap=sc,
                sink=sk, num_splits=ns, heads_q=q, heads_kv=kv,
                page_size=(page_size or self.page_size) if lay == "paged" else 0,
            )] = None
        return list(out)

    def _head_counts(self, heads: tuple[int, ...]) -> list[tuple[int, int]]:
        """(query heads, 0) per query head count, or (0, KV heads) per KV head count of `heads_kv`."""
        if heads or self.heads:
            return [(h, 0) for h in heads or self.heads]
        return [(0, kv) for kv in self.heads_kv]

    def calls(self, shapes: Shapes) -> list[Call]:
        """Every concrete call of this variant over the shape grid (duplicates removed, order kept)."""
        out: dict[Call, None] = {}
        for (b, q, k, h) in shapes.points():
            for sig in self.signatures((h,), shapes.page_size):
                out[sig.call(b, q, k)] = None
        return list(out)


def parse_variant(src: TomlSource, i: int, table: dict[str, Any], shapes: dict[str, Shapes]) -> Variant:
    """The `i`-th [[variants]] entry (not a model entry); raises ConfigError naming file, line, field and the
    allowed values."""
    fail = entry_fail(src, i)
    _check_fields(fail, i, table)
    t = {**DEFAULTS, **table}
    grid = _grid(fail, t, table, shapes)
    return Variant(
        name=t["name"], shapes=grid.name if grid else "", **_features(src, i, fail, t, grid),
        description=str(t["description"]),
        heads=() if grid else tuple(t.get("heads") or ()),
        heads_kv=() if grid else tuple(t.get("heads_kv") or ()),
        page_size=t["page_size"],
    )


def _check_fields(fail: Fail, i: int, table: dict[str, Any]) -> None:
    """Every field known, the required ones present, a non-empty name."""
    for key in table:
        if key not in VARIANT_FIELDS:
            raise fail(key, f"unknown field; allowed: {', '.join(VARIANT_FIELDS)}")
    for key in ("name", "passes", "head_dims"):
        if key not in table:
            raise fail(None, f"variant #{i + 1} is missing field {key!r}")
    if not isinstance(table["name"], str) or not table["name"]:
        raise fail("name", "expected a non-empty string")


def _features(src: TomlSource, i: int, fail: Fail, t: dict[str, Any], grid: Shapes | None) -> dict[str, Any]:
    """The call-feature fields of entry `t` (defaults filled in), checked in Variant's order."""
    return {
        "passes": choices(src, i, "passes", t["passes"], PASSES),
        "head_dims": _head_dims(fail, t["head_dims"]),
        "dtypes": choices(src, i, "dtypes", t["dtypes"], DTYPES),
        "masks": choices(src, i, "masks", t["masks"], MASKS),
        "window": _window(fail, t["window"]),
        "gqa": _gqa(fail, t["gqa"], grid.heads if grid else tuple(t.get("heads") or ()), grid.name if grid else "",
                    by_kv=not grid and t.get("heads_kv") is not None),
        "softcap": _floats(fail, "softcap", t["softcap"]),
        "sink": _bools(fail, t["sink"]),
        "layouts": choices(src, i, "layouts", t["layouts"], LAYOUTS),
        "num_splits": int_list(src, "[[variants]]", "num_splits", t["num_splits"], i, minimum=0),
        "archs": choices(src, i, "archs", t["archs"], ARCHS) if t["archs"] else (),
    }


def _grid(fail: Fail, t: dict[str, Any], table: dict[str, Any], shapes: dict[str, Shapes]) -> Shapes | None:
    """The variant's shape grid, or None for a shape-complete variant (which then needs `heads`)."""
    if "shapes" not in t:
        given = [f for f in ("heads", "heads_kv") if t.get(f) is not None]
        if len(given) != 1:
            raise fail(None, "a shape-complete variant (no 'shapes') needs one of field 'heads', the query head "
                             "counts such as [32, 64], or 'heads_kv', the KV head counts such as [1, 8] (each GQA "
                             "ratio then runs ratio x heads_kv query heads); or name a shape grid with shapes = "
                             "\"...\"" + (": not both" if given else ""))
        heads = t[given[0]]
        if not isinstance(heads, list) or not heads or not all(is_int(h) and h >= 1 for h in heads):
            raise fail(given[0], f"expected a non-empty list of positive integers, got {heads!r}")
        page = t["page_size"]
        if not is_int(page) or page <= 0:
            raise fail("page_size", f"expected a positive integer, got {page!r}")
        return None
    for field in ("heads", "heads_kv", "page_size"):
        if field in table:
            raise fail(field, f"comes from the shape grid {t['shapes']!r} here; drop it, or drop 'shapes' to "
                              "make the variant shape-complete")
    if not isinstance(t["shapes"], str) or t["shapes"] not in shapes:
        raise fail("shapes", f"unknown shape grid {t['shapes']!r}; defined: {', '.join(shapes) or 'none'}")
    return shapes[t["shapes"]]


def _head_dims(fail: Fail, value: Any) -> tuple[tuple[int, int], ...]:
    allowed = "64, 96, 128, 192, 256 or a [qk, v] pair such as [192, 128]"
    if not isinstance(value, list) or not value:
        raise fail("head_dims", f"expected a non-empty list of {allowed}")
    out = []
    for v in value:
        if isinstance(v, int) and not isinstance(v, bool):
            out.append((v, v))
        elif isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
            out.append((v[0], v[1]))
        else:
            raise fail("head_dims", f"bad entry {v!r}; allowed: {allowed}")
        if any(x <= 0 or x % 8 for x in out[-1]):
            raise fail("head_dims", f"bad entry {v!r}: head dims are positive multiples of 8")
    return tuple(out)


def _window(fail: Fail, value: Any) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, int) and x >= 0 for x in value)):
        raise fail("window", f"expected [left, right] with non-negative integers, got {value!r}")
    return value[0], value[1]


def _gqa(fail: Fail, value: Any, heads: tuple[int, ...], grid: str, by_kv: bool = False) -> tuple[int | str, ...]:
    if not isinstance(value, list) or not value:
        raise fail("gqa", "expected a non-empty list of query heads per KV head (1, 2, 4, 8...) or \"mqa\"")
    for r in value:
        if r == "mqa":
            if by_kv:
                raise fail("gqa", "\"mqa\" needs the query head counts ('heads'), not 'heads_kv': with one KV "
                                  "head, the ratio is the query head count (write it as a number)")
            continue
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise fail("gqa", f"bad ratio {r!r}; allowed: positive integers or \"mqa\"")
        bad = [h for h in heads if h % r]
        if bad:
            raise fail("gqa", f"ratio {r} does not divide heads {bad}" + (f" of shape grid {grid!r}" if grid else ""))
    return tuple(value)


def _floats(fail: Fail, field: str, value: Any) -> tuple[float, ...]:
    numbers = isinstance(value, list) and all((is_int(v) or isinstance(v, float)) and v >= 0 for v in value)
    if not value or not numbers:
        raise fail(field, f"expected a non-empty list of non-negative numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _bools(fail: Fail, value: Any) -> tuple[bool, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, bool) for v in value):
        raise fail("sink", f"expected a non-empty list of true/false, got {value!r}")
    return tuple(value)
