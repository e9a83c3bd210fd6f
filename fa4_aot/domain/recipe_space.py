"""The size space of a signature's recipes, and which of its points recorded regions cover (pure; numpy, no torch).

A build records a signature's recipe regions until they cover its whole size space (compile.lean.explore): every
batch, seqlen_q up to 256k and seqlen_k up to 1M as the shape-complete planner plans (probes.py), and for varlen,
seqused and paged calls every max length and pool size that goes with them. A region's guards are FA4's own
decisions (fa4/record.py), so a region never serves a size where FA4 would choose otherwise; what this module
decides is only where to record next: at points of the space that no region covers yet.

Points are drawn, many at once, from the probe values that reach every kernel (probes.py: both sides of every tile
edge, batch regimes, split batches, the seqlen_k sweep), from values next to the constants of the recorded guards,
and log-uniformly over each size's whole range; `covered` evaluates every region's guards on all of them at once
(numpy), each guard only where the ones before it hold; `Judge` evaluates each distinct guard of a round's regions
once (they share most of them), so a draw of 160,000 points is judged against a hundred regions in about a second.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np

from . import probes
from .recipe_format import HEADS, bound_sizes
from .signature import Signature
from .skus import Sku

MAX_BATCH = 1 << 16  # the draws' largest batch: FA4's batch tests end at 257 and num_SMs + 1 (probes.py)
MAX_POOL_PAGES = 1 << 22  # the largest paged pool drawn


@dataclass(frozen=True)
class Size:
    """One size of a layout: its range, the values that reach FA4's decisions on it, and how it depends on others
    (`upper`: a size expression of the point it may not exceed, e.g. a max length its tensor's length)."""

    name: str
    low: int
    high: int
    probes: tuple[int, ...]
    upper: Callable[[Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True)
class Space:
    """The sizes of one signature's calls (recipe_format.size_names of its layout, each after the sizes its bound reads)
    and the KV head counts of its GQA ratio drawn (`heads`: the signature's first)."""

    sizes: tuple[Size, ...]
    heads: tuple[int, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sizes)


def space(sig: Signature, sku: Sku) -> Space:
    """The size space of `sig` on `sku` (recipe_format.SIZE_NAMES of its layout)."""
    batches = _batches(sig, sku)
    sq, sk = tuple(probes.seqlens_q(sig)), tuple(_seqlens_k(sig))
    big_q, big_k = probes.MAX_SEQLEN_Q, probes.MAX_SEQLEN_K
    batch = Size("batch", 1, MAX_BATCH, batches)
    if sig.layout == "dense":
        sizes: tuple[Size, ...] = (batch, Size("seqlen_q", 1, big_q, sq), Size("seqlen_k", 1, big_k, sk))
    elif sig.layout == "varlen":
        sizes = (batch, Size("max_seqlen_q", 1, big_q, sq), Size("max_seqlen_k", 1, big_k, sk),
                 Size("total_q", 1, MAX_BATCH * big_q, sq, lambda p: p["batch"] * p["max_seqlen_q"]),
                 Size("total_k", 1, MAX_BATCH * big_k, sk, lambda p: p["batch"] * p["max_seqlen_k"]))
    elif sig.layout == "seqused":
        sizes = (batch, Size("seqlen_q", 1, big_q, sq), Size("seqlen_k", 1, big_k, sk),
                 Size("max_seqlen_q", 1, big_q, sq, lambda p: p["seqlen_q"]),
                 Size("max_seqlen_k", 1, big_k, sk, lambda p: p["seqlen_k"]))
    elif sig.layout == "paged":
        page = max(1, sig.page_size)
        pages = tuple(sorted({max(1, -(-v // page)) for v in sk}))
        sizes = (batch, Size("seqlen_q", 1, big_q, sq), Size("num_pages", 1, MAX_POOL_PAGES, pages),
                 Size("pages_per_seq", 1, -(-big_k // page), pages),
                 Size("max_seqlen_q", 1, big_q, sq, lambda p: p["seqlen_q"]),
                 Size("max_seqlen_k", 1, big_k, sk, lambda p: p["pages_per_seq"] * page))
    else:
        raise ValueError(f"layout {sig.layout!r} has no recipes")
    return Space(sizes, heads(sig))


# KV head counts a file by GQA ratio serves: FA4's dispatch reads a head count apart from the ratio only in size-1
# and layout tests of its tensors (a single KV head) and, on sm_100, 2 * batch * heads <= num_SMs (probes.py)
HEAD_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def heads(sig: Signature) -> tuple[int, ...]:
    """The KV head counts drawn for `sig`: its own first, then HEAD_COUNTS; with split-KV, its own and 1 only
    (FA4 compiles its combine kernel for one query head count, so other counts need other kernels whatever the
    recipes; each count would be regions of its own)."""
    others = HEAD_COUNTS if sig.num_splits == 1 else (1,)
    return (sig.heads_kv, *(h for h in others if h != sig.heads_kv))


def _batches(sig: Signature, sku: Sku) -> tuple[int, ...]:
    out = set(probes.batch_regimes(sig, sku)) | set(probes.split_batches(sku.sm_count)) | {2, 3}
    return tuple(sorted(b for v in out for b in (v - 1, v, v + 1) if 1 <= b <= MAX_BATCH))


def _seqlens_k(sig: Signature) -> list[int]:
    """seqlen_k values next to every tile edge and on the split sweep, whatever the pass (a forward's mask and
    window read seqlen_k too)."""
    out = set(probes.seqlens_k(sig)) | {1, 2, 3, probes.MAX_SEQLEN_K}
    out.update(v for t in probes.TILE_EDGES for v in (t - 1, t, t + 1))
    out.update(v for k in range(4, 21) for v in (2**k - 1, 2**k, 2**k + 1))
    if sig.mask == "local":
        out.update(v for w in sig.window for d in (-1, 0, 1, 2) for v in (w + d, 2 * w + d) if v >= 1)
    return sorted(v for v in out if 1 <= v <= probes.MAX_SEQLEN_K)


# -- drawing points --------------------------------------------------------------------------------------------
def draw(sp: Space, rng: np.random.Generator, count: int,
         extra: Mapping[str, Iterable[int]] | None = None) -> dict[str, Any]:
    """`count` points of `sp` as {size name: int64 array}. Two points in five are structured: every size a probe
    value or one of `extra` (next to recorded guards' constants), where FA4's decisions turn; the others draw each
    size from those values, log-uniformly over its range, or next to its bounds, a third each."""
    points: dict[str, Any] = {}
    extra = dict(extra or {})
    structured = rng.random(count) < 0.4
    for size in sp.sizes:
        high = np.full(count, size.high, dtype=np.int64)
        if size.upper is not None:
            high = np.minimum(high, np.asarray(size.upper(points), dtype=np.int64))
        high = np.maximum(high, size.low)
        values = np.array(sorted(set(size.probes) | set(extra.get(size.name, ()))), dtype=np.int64)
        pick = np.where(structured, 0, rng.integers(0, 3, count))
        chosen = values[rng.integers(0, len(values), count)]
        logs = rng.uniform(math.log(size.low), np.log(high + 1.0))
        spread = np.floor(np.exp(logs)).astype(np.int64)
        value = np.where(pick == 0, chosen, np.where(pick == 1, spread, _near(rng, high, size.low)))
        points[size.name] = np.clip(value, size.low, high)
    own = rng.integers(0, 2, count) == 0  # the signature's own head count half the time
    others = np.array(sp.heads, dtype=np.int64)[rng.integers(0, len(sp.heads), count)]
    points[HEADS] = np.where(own, sp.heads[0], others)
    return points


def pinned(points: dict[str, Any], sig: Signature) -> dict[str, Any]:
    """`points` with a column for each size `sig` fixes other than the KV head count (a paged call's page size, a
    local window's sides: recipe_format.bound_sizes), at the signature's value: a signature's space is explored at
    its own values, and the regions recorded there hold at every other value where FA4 chooses alike."""
    count = len(points[HEADS])
    for name, value in bound_sizes(sig).items():
        if name != HEADS:
            points[name] = np.full(count, value, dtype=np.int64)
    return points


def corners(sp: Space) -> dict[str, Any]:
    """Every combination of each size at its low end, next to it, and at its high end (its range's, or the size it
    may not exceed), at every head count: where FA4's size-1 tests all hold at once, or a huge batch meets
    one-token sequences, which draws reach seldom."""
    import itertools

    rows: list[dict[str, int]] = [{}]
    for size in sp.sizes:
        grown = []
        for row, pick in itertools.product(rows, range(3)):
            high = size.high if size.upper is None else max(size.low, min(size.high, int(size.upper(row))))
            grown.append({**row, size.name: (size.low, min(size.low + 1, high), high)[pick]})
        rows = grown
    rows = [{**row, HEADS: h} for row in rows for h in sp.heads]
    return {name: np.array([row[name] for row in rows], dtype=np.int64) for name in rows[0]}


def _near(rng: np.random.Generator, high: Any, low: int) -> Any:
    """Values at or next to a bound (the upper one is another size or the range's end)."""
    offset = rng.integers(0, 3, len(high))
    return np.where(rng.integers(0, 2, len(high)) == 0, high - offset, low + offset)


def point(points: Mapping[str, Any], i: int) -> dict[str, int]:
    return {name: int(values[i]) for name, values in points.items()}


def constants(guards: Iterable[Any]) -> set[int]:
    """The integer literals of `guards` and their quotients by the literals multiplying a size in them: where a
    guard such as 4 * seqlen_q > 128 turns (around 32 and 33)."""
    found: set[int] = set()

    def walk(expr: Any) -> None:
        if isinstance(expr, bool):
            return
        if isinstance(expr, int):
            found.add(expr)
            return
        if isinstance(expr, list) and expr and expr[0] not in ("sym", "frac"):
            for a in expr[1:]:
                walk(a)

    for g in guards:
        walk(g)
    factors = {c for c in found if 1 < c <= 4096}
    values = {c for c in found if c > 0} | {c // f for c in found if c > 0 for f in factors}
    return {v + d for v in values for d in (-1, 0, 1, 2) if v + d >= 1}


# -- which points the regions cover ----------------------------------------------------------------------------
def covered(guards: list[Any], points: Mapping[str, Any]) -> Any:
    """A bool array: where every guard holds (a guard that cannot be evaluated at a point, e.g. a division by
    zero, does not hold there).

    Each guard is evaluated only at the points where the guards before it hold: a region's first guards
    usually leave few of a draw's points, so the rest cost little (evaluation is elementwise, so the answer is
    the same as evaluating every guard everywhere)."""
    count = len(next(iter(points.values())))
    alive = np.arange(count)  # the points where every guard so far holds
    left: Mapping[str, Any] = points
    with np.errstate(all="ignore"):
        for g in guards:
            value, valid = _evaluate(g, left)
            holds = np.broadcast_to(np.asarray(value, dtype=bool) & valid, (len(alive),))
            if holds.all():
                continue
            alive = alive[holds]
            if not len(alive):
                break
            left = {name: np.asarray(values)[alive] for name, values in points.items()}
    result = np.zeros(count, dtype=bool)
    result[alive] = True
    return result


class Judge:
    """`covered` over one draw of points, for many regions: each distinct guard is evaluated once, then
    remembered. The regions of a signature are FA4's decision paths and share most of their guards (a hundred
    regions of fifteen guards hold about a hundred distinct ones), so judging every region of a round costs about
    as much as judging a few. The points must not change while the judge is in use."""

    def __init__(self, points: Mapping[str, Any]) -> None:
        self.points = points
        self.count = len(next(iter(points.values())))
        self._holds: dict[str, Any] = {}  # repr of a guard -> where it holds
        # repr of an operation inside a guard -> its (value, valid): guards share them (a tile count, a split
        # heuristic's terms); up to PARTS_BYTES of them
        self._parts = _Parts({}, PARTS_BYTES)

    def covered(self, guards: list[Any]) -> Any:
        """What `covered(guards, self.points)` returns (a new array)."""
        result = np.ones(self.count, dtype=bool)
        for g in guards:
            result &= self._guard(g)
            if not result.any():
                break
        return result

    def any_covers(self, guard_lists: Iterable[list[Any]]) -> Any:
        """A bool array: where at least one of the guard lists (one per region) holds."""
        found = np.zeros(self.count, dtype=bool)
        for guards in guard_lists:
            found |= self.covered(guards)
        return found

    def _guard(self, guard: Any) -> Any:
        key = repr(guard)
        if key not in self._holds:
            with np.errstate(all="ignore"):
                value, valid = _evaluate(guard, self.points, self._parts)
                self._holds[key] = np.broadcast_to(np.asarray(value, dtype=bool) & valid, (self.count,))
        return self._holds[key]


PARTS_BYTES = 64 << 20  # a judge's remembered operation results (int64 values and bool validity per point)


@dataclass
class _Parts:
    """Remembered (value, valid) of operations over one draw's points, by repr, while `room` bytes are left."""

    found: dict[str, tuple[Any, Any]]
    room: int


def _evaluate(expr: Any, points: Mapping[str, Any], memo: _Parts | None = None) -> tuple[Any, Any]:
    """(value, valid) of a symexpr expression over arrays of sizes; invalid where a division by zero happened.
    `memo`: operations already evaluated over the same points, read and filled (Judge's)."""
    if isinstance(expr, bool | int):
        return expr, True
    op = expr[0]
    if op == "sym":
        return points[expr[1]], True
    if op == "frac":
        return expr[1] / expr[2], True
    if memo is None:
        return _operation(op, [_evaluate(a, points) for a in expr[1:]])
    key = repr(expr)  # guards are JSON values: repr tells 1, 1.0 and True apart, as evaluation does
    if key in memo.found:
        return memo.found[key]
    found = _operation(op, [_evaluate(a, points, memo) for a in expr[1:]])
    if memo.room > 0:
        memo.found[key] = found
        memo.room -= sum(getattr(x, "nbytes", 0) for x in found)
    return found


def _operation(op: str, parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    args = [p[0] for p in parts]
    valid = reduce(operator.and_, (p[1] for p in parts), True)
    if op in ("floordiv", "mod"):
        divisor = args[1]
        valid = valid & (np.asarray(divisor) != 0)
        safe = np.where(np.asarray(divisor) == 0, 1, divisor)
        return (np.floor_divide if op == "floordiv" else np.mod)(args[0], safe), valid
    return _NUMPY[op](*args), valid


_NUMPY: dict[str, Callable[..., Any]] = {
    "add": lambda *xs: reduce(np.add, xs), "mul": lambda *xs: reduce(np.multiply, xs),
    "max": lambda *xs: reduce(np.maximum, xs), "min": lambda *xs: reduce(np.minimum, xs),
    "and": lambda *xs: reduce(np.logical_and, xs), "or": lambda *xs: reduce(np.logical_or, xs),
    "not": np.logical_not, "pow": np.power, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}
