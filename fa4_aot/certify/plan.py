"""Which GPU checks certify a store's kernels: for each signature, points of its size space drawn inside each
recipe region (the sizes at which FA4 launches exactly that region's kernels): each kernel in TYPICAL_PER_KERNEL
regions at a typical point, and at a small size, at a size next to one of its region's guard constants (where
FA4's choices turn) and at a large one, within bounds that keep the fp32 reference cheap; and each paged signature
once at a wide point, a decode over a KV pool past 32-bit offsets (_wide).

Pure planning over the store's recipe files (store.recipes, as the lean runtime and `coverage --runtime lean` read
them): no torch, no FA4, no GPU. A Check names its signature, its sizes and the kernels its region launches,
each resolved to the entry this SKU's device loads (the build with the device's constants where the kernel
consumed some).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compile.coverage_lean import Regions
from ..domain import kernel_keys, known_bad, probes, recipe_space
from ..domain.recipe_format import HEADS
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Constants, Sku
from ..store import Store, recipes

POINTS = 4000  # points drawn per signature and head-count regime; a region no point reaches is reported
SEED = 27
PER_KERNEL = 3  # checks per kernel: small, boundary, large
TYPICAL_PER_KERNEL = 2  # regions per kernel checked at their typical point: the default h200 build records 78,255
# regions for 2,485 kernels (31 a kernel), and a typical check of each took hours; a region's own steps (the lean
# runtime's replay of it) are the CPU differential tests' to check, the kernel's code is this run's
MAX_WORK = 1 << 34  # multiply-adds of one check's attention (the reference's cost), at most
MAX_ELEMENTS = 1 << 28  # elements of one input tensor, at most (1 GiB of fp32 in the reference)
MAX_BYTES = 6 << 30  # a check's estimated peak GPU memory (_memory), at most: a worker's share at -j 16 on an H200
# is 7.9 GiB (pool.GPU_SHARED); the default h200 build's certification met checks of 624 GiB and 2.7 TiB there
TILE = 128  # rows FA4's backward pads each sequence to (at most) in its fp32 accumulators, per head
SCORE_BLOCK = 1 << 26  # reference.CHUNK_ELEMENTS: scores of one block of the reference (this module has no torch)
KINDS = ("typical", "small", "boundary", "large", "wide")
WIDE_ELEMENTS = 5 << 29  # a wide check's KV pool: 1.25 x 2^31 elements of K and of V, past any signed 32-bit index
WIDE_BATCH, WIDE_PAGES = 4, 64  # its decode: 4 sequences of up to 64 pages each, drawn from all over the pool
WIDE_BYTES = 32 << 30  # a wide check's estimated peak GPU memory (_memory), at most: it runs with the GPU to itself


@dataclass(frozen=True)
class Use:
    """A kernel a check launches: its family, the key the device loads it under, and its part (fwd or bwd)."""

    family: str
    kernel_key: str

    @property
    def part(self) -> str:
        return known_bad.part_of(self.family)


@dataclass(frozen=True)
class Check:
    """One GPU call: `sig` at `point` (recipe_space's sizes plus the KV head count), launching `kernels`."""

    sig: Signature
    point: dict[str, int]
    kernels: tuple[Use, ...]
    kind: str  # typical (a region's median-cost point), small, boundary or large
    seed: int
    label: str = ""  # the work item (variant or model) it came from

    def to_dict(self) -> dict[str, Any]:
        return {"sig": self.sig.to_dict(), "point": self.point, "kernels": [[u.family, u.kernel_key] for u in
                                                                            self.kernels],
                "kind": self.kind, "seed": self.seed, "label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        return cls(Signature.from_dict(data["sig"]), {k: int(v) for k, v in data["point"].items()},
                   tuple(Use(f, k) for f, k in data["kernels"]), data["kind"], int(data["seed"]), data["label"])

    def describe(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in self.point.items())
        return f"{self.sig.pass_} {self.sig.layout} {self.sig.dtype} d={self.sig.head_dim} {self.sig.mask} " \
               f"h={self.sig.heads_q // self.sig.heads_kv}:1 {sizes}"


@dataclass
class Plan:
    """The checks, and what no check reaches: regions no drawn point held, signatures without recipes."""

    checks: list[Check] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)  # 'signature: why' lines

    def kernels(self) -> set[str]:
        return {u.kernel_key for c in self.checks for u in c.kernels}


def signatures_in(store: Store, sku: Sku, keys: set[str] | None = None) -> list[tuple[str, Signature]]:
    """(label, signature) of every signature the store recorded regions of for `sku` (each region names its
    signature), only those whose regions launch one of `keys` (or the base key it is filed under) when given:
    what a certification of "every kernel of the store" checks, whatever variants, models or misses built it."""
    bases = None if keys is None else set(keys).union(*(kernel_keys.entry_keys(e) for e in map(store.get_entry, keys)
                                                          if e is not None))
    found: dict[Signature, str] = {}
    for key, _data in recipes.keys_for(store, sku.target_facts()):
        for region in recipes.load(store, key):
            if bases is None or bases & {k.kernel_key for k in region.kernels}:
                found.setdefault(Signature.from_dict(region.signature), f"recipe {key[:12]}")
    return [(label, sig) for sig, label in found.items()]


def plan(store: Store, sku: Sku, items: Iterable[tuple[str, Signature]], *, keys: set[str] | None = None,
         constants: Constants | None = None, per_kernel: int = PER_KERNEL) -> Plan:
    """The checks of every signature in `items` ((label, signature) pairs; a training signature brings its
    forward without LSE too), PER_KERNEL per kernel where the regions allow, only of kernels in `keys` when given."""
    out = Plan()
    resolver = _Resolver(store, constants or sku.constants())
    regions = Regions(store, sku)
    counts: dict[str, int] = {}  # checks launching each kernel so far, of every kind
    seen: set[Signature] = set()
    for label, first in items:
        for sig in (first, *probes.forward_of(first)):
            if sig in seen:
                continue
            seen.add(sig)
            out.checks += _checks(sig, sku, regions.regions(sig), resolver, counts, keys, per_kernel, label,
                                  out.unreached)
    out.checks = _one_wide_per_kernel_set(out.checks)
    return out


def _one_wide_per_kernel_set(checks: list[Check]) -> list[Check]:
    """`checks` less each wide check whose kernels an earlier one launches already (signatures at other page sizes
    or models of one GQA ratio share a paged kernel): a wide check costs an 11 GB pool and the GPU to itself."""
    seen: set[frozenset[str]] = set()
    kept = []
    for check in checks:
        kernels = frozenset(u.kernel_key for u in check.kernels)
        if check.kind == "wide":
            if kernels in seen:
                continue
            seen.add(kernels)
        kept.append(check)
    return kept


def _checks(sig: Signature, sku: Sku, regions: list[Region], resolver: _Resolver, counts: dict[str, int],
            keys: set[str] | None, per_kernel: int, label: str, unreached: list[str]) -> list[Check]:
    """The typical point (its median cost: a size a model would call) of each region holding a kernel still under
    TYPICAL_PER_KERNEL checks, then the small, boundary and large points of the regions holding kernels still
    under `per_kernel` + TYPICAL_PER_KERNEL checks. A region no drawn size holds is reported only where it was
    wanted."""
    if not regions:
        unreached.append(f"{sig}: no recipe file in the store")
        return []
    held = _held_points(sig, sku, regions)
    unbuilt = _unbuilt(sig, regions, resolver, keys, unreached)
    chosen: list[tuple[str, int, dict[str, int]]] = []
    for limit, stage in ((TYPICAL_PER_KERNEL, "typical"), (TYPICAL_PER_KERNEL + per_kernel, "picked")):
        for index, region in enumerate(regions):
            if index in unbuilt:
                continue
            uses, points = resolver.uses(region), held.get(index)
            lacking = [counts.get(u.kernel_key, 0) for u in uses if keys is None or u.kernel_key in keys]
            if not lacking or min(lacking) >= limit:
                continue
            if not points:
                if stage == "typical":
                    unreached.append(f"{sig}: region {index} ({len(region.guards)} guards) held at no drawn size "
                                     "in the callers' domain within the check's bounds")
                continue
            picks = [("typical", points[len(points) // 2])] if stage == "typical" else \
                _pick(points, region, limit - min(lacking))
            for kind, point in picks:
                if (index, point) not in [(i, p) for _k, i, p in chosen]:  # points are dicts: compared, not hashed
                    chosen.append((kind, index, point))
                    _count(counts, uses)
    checks = [Check(sig, point, resolver.uses(regions[index]), kind, SEED + n, label)
              for n, (kind, index, point) in enumerate(chosen)]
    return checks + _wide(sig, regions, resolver, keys, unbuilt, label, unreached)


def _wide(sig: Signature, regions: list[Region], resolver: _Resolver, keys: set[str] | None, unbuilt: set[int],
          label: str, unreached: list[str]) -> list[Check]:
    """A paged signature's decode over a KV pool of more than 2^31 elements (WIDE_ELEMENTS of K and of V), its pages
    drawn from all over the pool: where a kernel indexing the pool with 32-bit offsets reads out of bounds (vLLM's
    FlexAttention paged K/V offsets overflowed int32 so: vllm-project/vllm#50427; FA2's backward overflowed a row
    offset at large batches: Dao-AILab/flash-attention#1500). A serving engine's KV cache is most of a GPU's
    memory; the ordinary checks' bounds (MAX_ELEMENTS) keep every input 8x below that index's reach. One check a
    signature, at its own KV head count (more where the pool would need more pages than a pool holds), run after
    the others with the GPU to itself (driver._Run)."""
    if sig.layout != "paged":
        return []
    page, dim = max(1, sig.page_size), min(sig.head_dim, sig.head_dim_v)
    fits = [h for h in recipe_space.heads(sig) if -(-WIDE_ELEMENTS // (page * h * dim)) <= recipe_space.MAX_POOL_PAGES]
    if not fits:
        unreached.append(f"{sig}: no KV head count gives a pool of {WIDE_ELEMENTS} elements within "
                         f"{recipe_space.MAX_POOL_PAGES} pages: no wide check")
        return []
    heads_kv = fits[0]
    sizes = {"batch": WIDE_BATCH, "seqlen_q": 1, "num_pages": -(-WIDE_ELEMENTS // (page * heads_kv * dim)),
             "pages_per_seq": WIDE_PAGES, "max_seqlen_q": 1, "max_seqlen_k": WIDE_PAGES * page, HEADS: heads_kv}
    points = recipe_space.pinned({name: np.array([v], dtype=np.int64) for name, v in sizes.items()}, sig)
    judge = recipe_space.Judge(points)
    index = next((i for i, region in enumerate(regions) if judge.covered(region.guards)[0]), None)
    if index is None:
        unreached.append(f"{sig}: no region holds the wide decode {sizes}: no wide check")
        return []
    if _memory(sig, points)[0] > WIDE_BYTES:
        unreached.append(f"{sig}: the wide decode {sizes} needs more than {WIDE_BYTES >> 30} GiB: no wide check")
        return []
    uses = resolver.uses(regions[index])
    if index in unbuilt or (keys is not None and not keys & {u.kernel_key for u in uses}):
        return []  # kernels the store lacks (reported by _unbuilt), or not asked for
    return [Check(sig, recipe_space.point(points, 0), uses, "wide", SEED + len(regions) + 1, label)]


def _unbuilt(sig: Signature, regions: list[Region], resolver: _Resolver, keys: set[str] | None,
             unreached: list[str]) -> set[int]:
    """Indices of the regions launching a kernel the store lacks for the device, reported (one line for the
    signature) where wanted. A build records regions over the whole size space but compiles a grid variant's or a
    calls file's kernels at their sizes only, a paged signature's at its page size (its page-size-1 regions name
    the non-TMA kernel where its page size is FA4's tile): there FA4 and the lean runtime alike raise
    KernelMissing, and the store holds no kernel to certify (the default h200 build's certification on the H200,
    2026-12-03: 154 such checks failed)."""
    found, wanted = set(), 0
    named: dict[str, None] = {}  # the absent kernels of the wanted regions, in order
    for index, region in enumerate(regions):
        uses = resolver.uses(region)
        absent = [u for u in uses if not resolver.built(u.kernel_key)]
        if absent:
            found.add(index)
        if absent and (keys is None or keys & {u.kernel_key for u in uses}):
            wanted += 1
            named.update({f"{u.family} {u.kernel_key[:16]}…": None for u in absent})
    if wanted:
        unreached.append(f"{sig}: {wanted} region(s) launch kernels the store lacks ({', '.join(list(named)[:3])}"
                         f"{', ...' if len(named) > 3 else ''}): not built, not checked")
    return found


def _count(counts: dict[str, int], uses: tuple[Use, ...]) -> None:
    for u in uses:
        counts[u.kernel_key] = counts.get(u.kernel_key, 0) + 1


def _held_points(sig: Signature, sku: Sku, regions: list[Region]) -> dict[int, list[dict[str, int]]]:
    """{region index: a sample of the points it holds at, cheapest first, its most expensive last}: points drawn
    at the signature's own KV head count, then at every head count of its ratio for the regions those did not
    reach. Each point goes to the first region holding it, as the runtime's lookup does."""
    sp = recipe_space.space(sig, sku)
    extra = _near_constants(regions)
    held: dict[int, list[dict[str, int]]] = {}
    for own in (True, False):
        points = recipe_space.pinned(recipe_space.draw(sp, np.random.default_rng(SEED + own), POINTS, extra), sig)
        _own_pages(sig, points)
        if own:
            points[HEADS][:] = sig.heads_kv
        keep = _within_bounds(sig, points)
        points = {k: v[keep] for k, v in points.items()}
        open_, judge = np.ones(len(points[HEADS]), dtype=bool), recipe_space.Judge(points)
        work = _work(sig, points)
        for index, region in enumerate(regions):
            hit = judge.covered(region.guards) & open_
            open_ &= ~hit
            if index not in held and hit.any():
                rows = np.flatnonzero(hit)[np.argsort(work[hit], kind="stable")]
                sample = np.unique(np.concatenate([rows[:32], rows[:: max(1, len(rows) // 32)], rows[-1:]]))
                sample = sample[np.argsort(work[sample], kind="stable")]
                held[index] = [recipe_space.point(points, int(i)) for i in sample]
        if len(held) == len(regions):
            break
    return held


def _own_pages(sig: Signature, points: dict[str, Any]) -> None:
    """Give every other point of a paged signature a KV cache whose sequences own their pages, as a serving engine's
    does without shared prefixes: a page table just long enough for the longest sequence, over a pool of batch x
    pages_per_seq pages (MAX_POOL_PAGES at most). The draws alone pick the pool and the table apart from the batch
    and the keys (30 sequences sharing a pool of one page, tables of 10,639 pages for 2 keys): the long decode
    caches of real serving (the paged head-dim-160 crash was met in one) were drawn seldom if ever."""
    if sig.layout != "paged":
        return
    every_other = np.arange(len(points[HEADS])) % 2 == 0
    page = max(1, sig.page_size)
    table = np.maximum(1, -(-points["max_seqlen_k"] // page))
    pool = np.minimum(points["batch"] * table, recipe_space.MAX_POOL_PAGES)
    points["pages_per_seq"] = np.where(every_other, table, points["pages_per_seq"])
    points["num_pages"] = np.where(every_other, pool, points["num_pages"])


def _pick(points: list[dict[str, int]], region: Region, need: int) -> Iterator[tuple[str, dict[str, int]]]:
    """Up to `need` distinct points: the cheapest, one next to a guard constant (the median such), the largest."""
    constants = recipe_space.constants(region.guards)
    near = {c + d for c in constants for d in (-1, 0, 1)}
    edges = [p for p in points[1:-1] if any(v in near for k, v in p.items() if k != HEADS)]
    boundary = edges[len(edges) // 2] if edges else None
    chosen = [("small", points[0]), ("boundary", boundary), ("large", points[-1])]
    picked: list[dict[str, int]] = []
    for kind, point in chosen:
        if point is not None and point not in picked and len(picked) < need:
            picked.append(point)
            yield kind, point


def _near_constants(regions: list[Region]) -> dict[str, list[int]]:
    values = sorted({c + d for r in regions for c in recipe_space.constants(r.guards) for d in (-1, 0, 1)
                     if c + d >= 1})
    return {name: values for name in ("batch", "seqlen_q", "seqlen_k", "max_seqlen_q", "max_seqlen_k", "total_q",
                                      "total_k", "num_pages", "pages_per_seq")}


def _work(sig: Signature, points: dict[str, Any]) -> Any:
    """Multiply-adds of the attention at each point (per KV head group: query heads x (d + dv))."""
    heads_q = points[HEADS] * (sig.heads_q // max(1, sig.heads_kv))
    dims = sig.head_dim + sig.head_dim_v
    if sig.layout == "varlen":
        return points["total_q"] * points["max_seqlen_k"] * heads_q * dims
    if sig.layout == "paged":
        return points["batch"] * points["seqlen_q"] * points["max_seqlen_k"] * heads_q * dims
    return points["batch"] * points["seqlen_q"] * points["seqlen_k"] * heads_q * dims


def in_domain(sig: Signature, points: Mapping[str, Any]) -> Any:
    """Where `points` (recipe_space's sizes of sig.layout: int arrays, or ints for one point) are calls FA4's
    callers make, the only calls a certification checks (a bool array, or a bool):
    - seqused, paged (a KV cache, as vLLM and SGLang call it): max_seqlen_q is the query tensor's length (FA4 takes
      a shorter one, and on sm_100 sizes its grid from it: the rows past it are never written, a call no
      reference can judge), and the new queries' own keys are in the cache already, so each sequence holds at
      least its query count of keys: max_seqlen_k >= max_seqlen_q >= 1 (inputs draws every seqused_k in
      [seqlen_q, max_seqlen_k]);
    - varlen: max_seqlen_q and max_seqlen_k are the longest sequence's lengths, at most total_q and total_k;
    - dense: every point.
    A call outside it (a cache shorter than its queries: rows that see no key, sequences with none; the H200's
    12 illegal addresses over the default build were all such paged calls) may be an FA4 bug worth reporting,
    but it must not condemn the kernel every decode uses; regions it alone holds are reported unreached."""
    if sig.layout in ("seqused", "paged"):
        rows = np.asarray(points["max_seqlen_q"])
        return (rows == np.asarray(points["seqlen_q"])) & (rows >= 1) & (np.asarray(points["max_seqlen_k"]) >= rows)
    if sig.layout == "varlen":
        return (np.asarray(points["max_seqlen_q"]) <= np.asarray(points["total_q"])) & \
            (np.asarray(points["max_seqlen_k"]) <= np.asarray(points["total_k"]))
    return np.ones(np.shape(points["batch"]), dtype=bool)


def _within_bounds(sig: Signature, points: dict[str, Any]) -> Any:
    """Points in the callers' domain (in_domain) whose attention, largest input and estimated peak memory stay
    within MAX_WORK, MAX_ELEMENTS and MAX_BYTES."""
    heads_q = points[HEADS] * (sig.heads_q // max(1, sig.heads_kv))
    dim = max(sig.head_dim, sig.head_dim_v)
    if sig.layout == "varlen":
        rows = np.maximum(points["total_q"] * heads_q, points["total_k"] * points[HEADS])
    elif sig.layout == "paged":
        rows = np.maximum(points["batch"] * points["seqlen_q"] * heads_q,
                          points["num_pages"] * max(1, sig.page_size) * points[HEADS])
    else:
        rows = np.maximum(points["batch"] * points["seqlen_q"] * heads_q, points["batch"] * points["seqlen_k"]
                          * points[HEADS])
    return ((_work(sig, points) <= MAX_WORK) & (rows * dim <= MAX_ELEMENTS) & in_domain(sig, points)
            & (_memory(sig, points) <= MAX_BYTES))


def peak_bytes(check: Check) -> int:
    """The estimated peak GPU bytes of one check (_memory at its point): what the pool grants it memory after."""
    point = {name: np.array([value], dtype=np.int64) for name, value in check.point.items()}
    point.setdefault(HEADS, np.array([check.sig.heads_kv], dtype=np.int64))
    return int(_memory(check.sig, point)[0])


def _memory(sig: Signature, points: dict[str, Any]) -> Any:
    """Estimated peak GPU bytes of a check at each point (a sum, so an upper bound): the inputs; FA4's and the lean
    runtime's results (FA4's twice for a deterministic backward); FA4's backward accumulators in fp32, padded to
    TILE rows per sequence and head (batch x heads x TILE rows more than the call's: what ran out at batch 65,534)
    and its split-KV partial outputs; both references' results, the fp32 one's converted inputs (of a KV pool, the
    gathered pages only) and its padded copies (varlen sequences padded per group, paged keys gathered per sequence)
    and a few score blocks."""
    f = {name: np.asarray(v, dtype=np.float64) for name, v in points.items()}  # float: no int64 overflow
    heads_kv, dims, training = f[HEADS], sig.head_dim + sig.head_dim_v, sig.pass_ in ("bwd", "bwd_det")
    heads_q = heads_kv * (sig.heads_q // max(1, sig.heads_kv))
    rows_q, rows_k = _rows(sig, f)
    q, kv, out = rows_q * heads_q * sig.head_dim, rows_k * heads_kv * dims, rows_q * heads_q * sig.head_dim_v
    grads = training * (q + kv)
    padded = f["batch"] * TILE
    fa4 = 4 * (training * heads_q * (rows_q + padded) * (sig.head_dim + 2) + max(1, sig.num_splits) * out
               + (training and sig.heads_q != sig.heads_kv) * heads_kv * (rows_k + padded) * dims)
    results = (3 if sig.pass_ == "bwd_det" else 2) * 2 * (out + grads) + (4 + 2) * (out + grads)
    copies = (1 + training) * _gathered(sig, f, heads_q, heads_kv, dims)
    scores = 5 * np.minimum(SCORE_BLOCK, _work(sig, points) / dims)  # s, exp, P and their casts of a block
    converted = kv if sig.layout != "paged" else 0  # a KV pool is converted once gathered (reference.reference)
    return 2 * (q + kv + training * out) + fa4 + results + 4 * (q + converted + copies + scores)


def _rows(sig: Signature, f: dict[str, Any]) -> tuple[Any, Any]:
    """(query rows, key rows) of the call's q and k/v tensors at each point."""
    if sig.layout == "varlen":
        return f["total_q"], f["total_k"]
    if sig.layout == "paged":
        return f["batch"] * f["seqlen_q"], f["num_pages"] * max(1, sig.page_size)
    return f["batch"] * f["seqlen_q"], f["batch"] * f["seqlen_k"]


def _gathered(sig: Signature, f: dict[str, Any], heads_q: Any, heads_kv: Any, dims: int) -> Any:
    """Elements the reference copies out of the call's tensors: varlen's sequences with rows (at most total_q of
    them), each padded to max_seqlen_q rows and max_seqlen_k keys; paged's keys gathered to max_seqlen_k a
    sequence. Dense and seqused slice without copying."""
    if sig.layout == "varlen":
        live = np.minimum(f["batch"], f["total_q"])
        return live * (f["max_seqlen_q"] * heads_q + f["max_seqlen_k"] * heads_kv) * dims
    if sig.layout == "paged":
        return f["batch"] * f["max_seqlen_k"] * heads_kv * dims
    return np.zeros_like(heads_kv)


class _Resolver:
    """A region's kernels as the device loads them: the entry for the device's constants (Libraries' rule)."""

    def __init__(self, store: Store, constants: Constants) -> None:
        self.store, self.constants = store, constants
        self._keys: dict[str, str] = {}
        self._built: dict[str, bool] = {}

    def uses(self, region: Region) -> tuple[Use, ...]:
        return tuple(Use(k.family, self.key(k.kernel_key)) for k in region.kernels)

    def built(self, kernel_key: str) -> bool:
        """Whether the store holds the kernel under `kernel_key` (a key `key` resolved)."""
        if kernel_key not in self._built:
            self._built[kernel_key] = self.store.get_entry(kernel_key) is not None
        return self._built[kernel_key]

    def key(self, base_key: str) -> str:
        """kernel_keys.device_key of `base_key` for the constants planned for; `base_key` itself where this version
        cannot compute one of them (the base entry's own build is then the one checked, as before this rule)."""
        if base_key not in self._keys:
            try:
                full = kernel_keys.device_key(base_key, self.store.get_entry(base_key), self.constants)
            except ValueError:
                full = base_key
            self._keys[base_key] = full
        return self._keys[base_key]
