"""Recipes in the store: recipes/<ab>/<recipe key>.json holds every recorded region of one signature on one SKU.

The recipe key is sha256 of the signature and the SKU's target facts; it needs no compiler to compute, so a lean
GPU host finds its recipes without cutlass. It names only what FA4's compile key and host dispatch tell apart:
head counts only through the GQA ratio, and neither a paged call's page size nor a local window's sides:
regions (recipe format 3) hold the KV head count, the page size and the window as sizes, guarded like
the lengths, so one file serves a signature at every head count of its ratio, every page size and every window.
Files of format 2 (keyed by the page size and window too) and format 1 (by both head counts) are still read, under
their own keys (`sources`). Each region names the toolchain it
was recorded with; a build with another toolchain replaces the regions of the old one (its kernel keys differ
anyway).
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

from ..domain import kernel_keys, recipe_file, symexpr
from ..domain.recipe_format import FORMATS, RECIPE_FORMAT
from ..domain.region import LazyRegion, Region, lazy_regions, parse_regions
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..domain.symexpr import bounded
from ..errors import StoreError
from . import Store

MAX_BYTES = 8 << 20  # a recipe file a server accepts: regions are a few KB each


def recipe_key(sig: Signature, sku: Sku, fmt: int = RECIPE_FORMAT) -> str:
    """The key of the file holding `sig`'s regions of format `fmt` on `sku` (format 3: by GQA ratio, mask without
    window, layout without page size; format 2: by GQA ratio; format 1: `legacy_key`)."""
    return file_key(keyed_signature(sig.to_dict(), fmt), sku.target_facts())


def legacy_key(sig: Signature, sku: Sku) -> str:
    """The key a format-1 file of `sig` on `sku` has (head counts named): stores built before format 2."""
    return file_key(sig.to_dict(), sku.target_facts())


# A forward returning LSE (no grad) launches exactly what a training call's forward launches (FA4 allocates LSE
# for either; tests/runtime/test_lean_parity.py compares them), so a training file serves it, backward dropped.
# A forward without LSE does not: FA4 compiles another kernel for it (its compile key holds `lse is None`).
_SERVED_BY = {"fwd_lse": ("bwd", "bwd_det")}


class Source(NamedTuple):
    """A recipe file that may serve a signature, and whether only its regions' forward steps do."""

    key: str
    forward_only: bool

    def serve(self, regions: list[_Served]) -> list[_Served]:
        """The file's `regions` (Regions, or Stored ones) as they serve the signature: their forward parts where
        only those do."""
        return [r.forward_part() for r in regions] if self.forward_only else regions


def sources(sig: Signature, sku: Sku) -> list[Source]:
    """Every file whose regions may serve `sig` on `sku`, in the order to use them: its own file (format 3), its
    format-2 file (by page size and window too) and its format-1 file (by head counts), then those of the
    training signatures whose forward FA4 runs for it (their regions' forward steps only)."""
    found: dict[str, bool] = {}
    for pass_ in (sig.pass_, *_SERVED_BY.get(sig.pass_, ())):
        other = dataclasses.replace(sig, pass_=pass_)
        for key in (recipe_key(other, sku), recipe_key(other, sku, 2), legacy_key(other, sku)):
            found.setdefault(key, pass_ != sig.pass_)
    return [Source(key, forward) for key, forward in found.items()]


def keyed_signature(signature: Any, fmt: int = RECIPE_FORMAT) -> Any:
    """What a key of format `fmt` (2 or 3) names of a signature (as Signature.to_dict writes it): every field but
    the head counts, and FA4's `qhead_per_kvhead` in their place; format 3 names neither the page size nor the
    window either (regions hold them as sizes: recipe_format.bound_sizes). A signature FA4 refuses (query heads not
    a multiple of KV heads) is left as it is: no region is ever recorded for it."""
    if not isinstance(signature, dict):
        return signature
    hq, hkv = signature.get("heads_q"), signature.get("heads_kv")
    if isinstance(hq, bool) or isinstance(hkv, bool) or not (isinstance(hq, int) and isinstance(hkv, int)) \
            or hkv <= 0 or hq % hkv:
        return signature
    dropped = ("heads_q", "heads_kv") + (("page_size", "window") if fmt >= 3 else ())
    doc = {k: v for k, v in signature.items() if k not in dropped}
    doc["qhead_per_kvhead"] = hq // hkv
    return doc


def region_key(region: dict[str, Any], target: dict[str, Any]) -> str:
    """The key a file holding `region` has on a SKU with facts `target` (by its format)."""
    signature, fmt = region.get("signature"), region.get("format")
    return file_key(signature if fmt == 1 else keyed_signature(signature, fmt if fmt in FORMATS else 0), target)


def file_key(signature: Any, target: dict[str, Any]) -> str:
    """The recipe key of a signature (as Signature.to_dict writes it) on a SKU with target facts `target`."""
    doc = {"signature": signature, "target": target}
    return hashlib.sha256(kernel_keys.dumps(doc).encode()).hexdigest()


def check_file(data: bytes, key: str, target: dict[str, Any]) -> None:
    """ValueError unless `data` is a recipe file a server may keep under `key` for a SKU with facts `target`:
    at most MAX_BYTES, compact or JSON (domain/recipe_file.py), holding {"key": key, "regions": [...]} whose every
    region's signature hashes, with `target`, to `key` (so a file cannot sit under another signature's or SKU's
    key) and whose every region holds only what recipe_format admits (FA4's host ops, bounded arithmetic)."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"recipe file of {len(data)} bytes is over the {MAX_BYTES}-byte limit")
    doc = recipe_file.decode(data)
    if doc.get("key") != key:
        raise ValueError(f"recipe file does not hold key {key}")
    regions = doc.get("regions")
    if not isinstance(regions, list) or not regions or not all(isinstance(r, dict) for r in regions):
        raise ValueError("recipe file has no list of regions")
    for region in regions:
        if region_key(region, target) != key:
            raise ValueError(f"a region's signature and the SKU's facts {kernel_keys.dumps(target)} do not hash "
                             f"to recipe key {key}; publish the file under the SKU it was built for")
    parse_regions(regions)


def load(store: Store, key: str, check: Callable[[str, bytes], None] | None = None) -> list[Region]:
    """The recorded regions under `key` ([] when none), every one checked: builds, coverage and certification,
    which read every region. `check(key, bytes)` may refuse the file by raising (the client's trust policy:
    trust.policy.Trust.check_recipe) before a byte of it is parsed; StoreError for a file that is not a recipe file
    (domain/recipe_file.py), holds another key, or holds what recipe_format refuses (signed or not: a recipe runs
    only FA4's host ops), naming the first region refused. Parsed once per process, as load_lazy."""
    return [stored.region() for stored in load_lazy(store, key, check)]


def load_lazy(store: Store, key: str, check: Callable[[str, bytes], None] | None = None) -> list[Stored]:
    """The recorded regions under `key` ([] when none) as the lean runtime reads them: `check` and the file's own
    checks (its bytes, key, bounds and nesting) at once, as load; of each region, the guards at once
    (recipe_format.check_guards: find evaluates them) and the rest, unpacked from a compact file's tables then, at
    its first `Stored.region()`, when a call first selects it (a region never selected is never unpacked or
    checked, and never runs). StoreError, as load raises it, for a file refused at once or, from Stored.region,
    for the region refused (with the whole file's message: "unreadable ..." for an index outside a table). Files
    are parsed once per process by their bytes' sha256 (`_parsed`): sources, builds and certification load the
    same file many times."""
    data = store.recipes(key)
    if data is None:
        return []
    if check is not None:
        check(key, data)
    digest = hashlib.sha256(data).digest()
    found = _parsed.get((key, digest))
    if found is None:
        if len(_parsed) >= _PARSED_MAX:  # cleared whole, as _compiled is: no iteration another thread may upset
            _parsed.clear()
        found = _parsed[(key, digest)] = tuple(_parse(store, key, data))
    where = _where(store, key)  # a list of its own (find() reorders the list it is given), naming this store
    return [Stored(lazy, where) for lazy in found]


class Stored:
    """A region of a stored recipe file: its guards admitted when the file was read, the rest checked at the first
    `region()` (load_lazy); its LazyRegion (checked once) is shared by every reader of the file in the process
    (`_parsed`)."""

    __slots__ = ("guards", "_lazy", "_where", "_forward", "_region")

    def __init__(self, lazy: LazyRegion, where: str, forward: bool = False) -> None:
        self.guards = lazy.guards
        self._lazy, self._where, self._forward = lazy, where, forward
        self._region: Region | None = None

    def region(self) -> Region:
        """The Region, checked (once; the same object after); StoreError naming the file and what recipe_format
        refuses in the region, as load names it, each time a refused region is asked for."""
        found = self._region
        if found is None:
            try:
                found = self._lazy.region()
            except recipe_file.Unreadable as e:  # an index a compact file's region names outside its tables
                raise _unreadable(self._where, e) from None
            except ValueError as e:
                raise _refused(self._where, e) from None
            found = self._region = found.forward_part() if self._forward else found
        return found

    def forward_part(self) -> Stored:
        """The region as Region.forward_part serves it (store.recipes.Source.serve), checked as this one is."""
        return Stored(self._lazy, self._where, forward=True)


class _Guarded(Protocol):
    @property
    def guards(self) -> list[Any]: ...


class _Serving(_Guarded, Protocol):
    def forward_part(self) -> Any: ...


_Found = TypeVar("_Found", bound=_Guarded)
_Served = TypeVar("_Served", bound=_Serving)

# (key, sha256 of the file's bytes) -> its regions (shared; each checked once, at its first use)
_parsed: dict[tuple[str, bytes], tuple[LazyRegion, ...]] = {}
_PARSED_MAX = 4096


def _refused(where: str, e: ValueError) -> StoreError:
    return StoreError(f"{where} is refused: {e}; rerun `fa4-aot build` (it rewrites the file) or pull it again "
                      "from a server that holds a good one")


def _unreadable(where: str, e: ValueError) -> StoreError:
    return StoreError(f"unreadable {where}: {e}; rerun `fa4-aot build` (it rewrites the file)")


def _where(store: Store, key: str) -> str:
    return f"recipe file {key} in {store.root}"


def _parse(store: Store, key: str, data: bytes) -> list[LazyRegion]:
    """The file's regions, read as load_lazy says: the file's bounds and every region's guards now, a compact
    file's regions unpacked at their first use (recipe_file.read). A file refused now is refused as the whole
    file's decode refuses it (_decoded): a file with several faults is refused for the one named before regions
    were unpacked at first use, and a region whose unpacking fails at its first use with decode's message."""
    try:
        doc = recipe_file.read(data)
        if doc.get("key") == key:
            return lazy_regions(doc.get("regions"))
    except ValueError:
        pass
    return _decoded(store, key, data)


def _decoded(store: Store, key: str, data: bytes) -> list[LazyRegion]:
    """_parse by decoding the whole file first: how any file refused at first read is refused."""
    try:
        doc = recipe_file.decode(data)
    except ValueError as e:
        raise _unreadable(_where(store, key), e) from None
    if doc.get("key") != key:
        raise StoreError(f"recipe file {key} in {store.root} holds key {str(doc.get('key'))[:80]!r}; rerun "
                         "`fa4-aot build`")
    try:
        return lazy_regions(doc.get("regions"))
    except ValueError as e:
        raise _refused(_where(store, key), e) from None


def merge(store: Store, key: str, regions: list[Region]) -> int:
    """Add `regions` under `key` (under the key's lock), dropping regions of other toolchains and duplicates.
    Returns how many regions the file holds now."""
    if not regions:
        return len(load(store, key))
    with store.lock(key):
        tools = regions[-1].toolchain
        try:
            kept = [r for r in load(store, key) if r.toolchain == tools]
        except StoreError:  # an unreadable file is replaced by what this build recorded
            kept = []
        seen = {kernel_keys.dumps(r.guards) for r in kept}
        for region in regions:
            if region.toolchain == tools and kernel_keys.dumps(region.guards) not in seen:
                kept.append(region)
                seen.add(kernel_keys.dumps(region.guards))
        store.put_recipes(key, recipe_file.encode(key, [r.to_json() for r in kept]))
    return len(kept)


def find(regions: list[_Found], sizes: dict[str, int]) -> _Found | None:
    """The region (a Region, or a Stored one: its guards are checked) whose guards hold at `sizes`, or None.
    Regions never disagree where they overlap (each is FA4's own choice there), so the first that holds is FA4's.
    The region found moves to the front of `regions`: a signature's calls come in runs of one region (decode steps,
    one training shape), so the next lookup tries it first. Guards are evaluated compiled (`_compiled`), about ten
    times faster than symexpr.evaluate."""
    for i, region in enumerate(regions):
        if _holds(region.guards, sizes):
            if i:
                regions.insert(0, regions.pop(i))
            return region
    return None


def _holds(guards: list[Any], sizes: dict[str, int]) -> bool:
    found = _compiled.get(id(guards))
    if found is None or found[0] is not guards:
        if len(_compiled) > 100_000:
            _compiled.clear()
        found = _compiled[id(guards)] = (guards, [_compile(g) for g in guards])
    try:
        return all(check(sizes) for check in found[1])
    except (ValueError, ZeroDivisionError, KeyError):  # symexpr.evaluate's refusals: the region does not hold
        return False


# id(guards) -> (guards, compiled guards); the list is kept so that its id is not reused while cached
_compiled: dict[int, tuple[list[Any], list[Callable[[dict[str, int]], Any]]]] = {}
_OPS: dict[str, Callable[..., Any]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "floordiv": operator.floordiv, "mod": operator.mod,
}


def _compile(expr: Any) -> Callable[[dict[str, int]], Any]:
    """A closure computing a symexpr expression (checked by recipe_format at load) as symexpr.evaluate does,
    refusing what it refuses: every size and every partial sum and product is held to symexpr.bounded
    (without it a checked product of 2**62s ran for seconds and held where evaluate refuses). The common ops
    directly, pow and fractions through symexpr.evaluate itself."""
    if isinstance(expr, bool | int):
        return lambda sizes: expr
    op, args = expr[0], expr[1:]
    if op == "sym":
        name = args[0]
        return lambda sizes: bounded(sizes[name])
    if op in ("pow", "frac") or any(isinstance(a, list) and a[0] in ("pow", "frac") for a in args):
        return lambda sizes: symexpr.evaluate(expr, sizes)
    parts = [_compile(a) for a in args]
    if op in _OPS:
        a, b = parts
        fn = _OPS[op]
        return lambda sizes: fn(a(sizes), b(sizes))
    if op in ("add", "mul"):
        return _fold(operator.add if op == "add" else operator.mul, parts)
    if op in ("max", "min", "and", "or"):
        folds: dict[str, Callable[[list[Any]], Any]] = {"max": max, "min": min, "and": all, "or": any}
        fold = folds[op]
        return lambda sizes: fold([p(sizes) for p in parts])
    if op == "not":
        return lambda sizes: not parts[0](sizes)
    return lambda sizes: symexpr.evaluate(expr, sizes)


def _fold(fn: Callable[[Any, Any], Any], parts: list[Callable[[dict[str, int]], Any]]
          ) -> Callable[[dict[str, int]], Any]:
    """A variadic add or mul, each partial result bounded as symexpr.evaluate bounds it."""
    first, rest = parts[0], parts[1:]

    def fold(sizes: dict[str, int]) -> Any:
        value = first(sizes)
        for p in rest:
            value = bounded(fn(value, p(sizes)))
        return value

    return fold


def keys_for(store: Store, target: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    """(key, bytes) of every readable recipe file in `store` recorded for a SKU with facts `target` (its
    regions' signatures hash, with `target`, to its key); files of other SKUs and unreadable ones are passed over."""
    for found in store.scan_recipes():
        data = store.recipes(found.name) if found.kind == "file" else None
        if data is None:
            continue
        try:
            check_file(data, found.name, target)
        except ValueError:
            continue
        yield found.name, data
