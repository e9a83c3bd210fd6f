"""What `fa4-aot coverage --runtime lean` reads of a store: a call's recipe region and the kernels it names, as the
lean runtime (runtime.runner.Attention) finds them, without torch, FA4 or a GPU. Judging itself is coverage.judge_lean,
over the Lookups made here.

A call: its signature's recipe files in the order the runtime reads them (store.recipes.sources: by GQA ratio, by
head counts for stores from before, a training file's forward for a forward with LSE), the region whose guards
hold at its sizes (with its KV head count), and that region's kernels, each served only if the store holds it for
the SKU (the build with the SKU's constants where it consumed some) with a library for the SKU's host. A model
signature: the same for every point of its size space a build explores (recipe_space), drawn afresh at its own
head count, for the signature and, when it trains, its forward without LSE (probes.forward_of: planned and
recorded with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..domain import probes, recipe_space
from ..domain.calls import Call
from ..domain.recipe_format import HEADS, SIZE_NAMES, call_sizes
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..store import Store, recipes

POINTS = 20_000  # points of a signature's size space judged (a build explores until rounds of 20,000 are covered)
SEED = 17


Kernel = tuple[str, str]  # (family, kernel key)


@dataclass(frozen=True)
class Lookup:
    """What the store holds for one item on the lean runtime: the kernels of the regions serving it, and where
    no region holds ('' when one always does: then it is served if every kernel is present)."""

    kernels: tuple[Kernel, ...]
    outside: str = ""
    unsupported: str = ""  # what the lean runtime refuses about the item whatever the store holds


class Regions:
    """The recipe regions of a store for one SKU, each file read once."""

    def __init__(self, store: Store, sku: Sku) -> None:
        self.store, self.sku = store, sku
        self._files: dict[str, list[Region]] = {}

    def regions(self, sig: Signature) -> list[Region]:
        """Every region the lean runtime reads for `sig`, in its order (StoreError for a refused file)."""
        found = []
        for source in recipes.sources(sig, self.sku):
            if source.key not in self._files:
                self._files[source.key] = recipes.load(self.store, source.key)
            found += source.serve(self._files[source.key])
        return found

    def of_call(self, call: Call) -> Lookup:
        sig = Signature.of(call)
        refused = unsupported(sig, self.sku)
        if refused:
            return Lookup((), unsupported=refused)
        sizes = call_sizes(call)
        regions = self.regions(sig)
        region = recipes.find(regions, sizes)
        if region is None:
            return Lookup((), outside=f"{_fields(sizes)} ({len(regions)} region(s) recorded)")
        return Lookup(_kernels(region))

    def of_signature(self, sig: Signature) -> Lookup:
        """Every kernel of the regions holding at POINTS drawn points of `sig`'s size space (and of its forward
        without LSE when it trains), or the first point no region holds at."""
        kernels: dict[Kernel, None] = {}
        for each in (sig, *probes.forward_of(sig)):
            refused = unsupported(each, self.sku)
            if refused:
                return Lookup((), unsupported=refused)
            regions = self.regions(each)
            points = recipe_space.pinned(recipe_space.draw(recipe_space.space(each, self.sku),
                                                           np.random.default_rng(SEED), POINTS), each)
            points[HEADS][:] = each.heads_kv  # the signature's own head count, as FA4's plan of it
            open_, judge = np.ones(POINTS, dtype=bool), recipe_space.Judge(points)
            for region in regions:
                held = judge.covered(region.guards) & open_
                if held.any():
                    kernels.update(dict.fromkeys(_kernels(region)))
                    open_ &= ~held
            if open_.any():
                at = recipe_space.point(points, int(np.argmax(open_)))
                outside = f"{_fields(at)} of {each.pass_} ({len(regions)} region(s) recorded)"
                return Lookup(tuple(kernels), outside=outside)
        return Lookup(tuple(kernels))


def unsupported(sig: Signature, sku: Sku) -> str:
    """What the lean runtime refuses about `sig` on `sku` whatever the store holds ('' when nothing)."""
    if sig.layout not in SIZE_NAMES:
        return f"the lean runtime has no recipes for layout {sig.layout!r}"
    if sig.num_splits > 1 and sku.arch == "sm_90a":
        return f"num_splits={sig.num_splits}: FA4 has no split-KV kernels for sm_90 (fa4_aot.Unsupported)"
    return ""


def held(store: Store, sku: Sku) -> Callable[[str], bool]:
    """Whether the store serves a base kernel key to the lean runtime on `sku`: the kernel (its build with the
    SKU's constants where it consumed some) with a library for the SKU's host and every runtime library it needs."""
    from .orchestrator import stored_key

    def has(base: str) -> bool:
        key = stored_key(store, base, sku)
        entry = store.get_entry(key) if key is not None else None
        return entry is not None and store.has_library(entry, sku.host_target.arch)

    return has


def _kernels(region: Region) -> tuple[Kernel, ...]:
    return tuple((k.family, k.kernel_key) for k in region.kernels)


def _fields(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())
