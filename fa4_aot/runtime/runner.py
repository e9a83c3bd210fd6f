"""The lean runtime: FA4's forward and backward from the store, importing only torch, tvm_ffi and fa4_aot.

A call's signature (flags, heads, head dims, dtype) names its recipe file (store.recipes); the call's sizes pick
the region whose guards hold, i.e. the choices FA4 itself makes at these sizes; the region's steps (FA4's
allocations, zero fills, views and kernel launches, recorded by the planner) are replayed with the linked
kernels (libraries), each pass's kernels loaded at that pass's first call. Autograd: forward and backward are one
torch.autograd.Function, as in FA4.

runtime() applies the client's trust policy (trust/policy.py, FA4_AOT_TRUSTED_KEYS) to every recipe file and library
before use, and with FA4_AOT_SERVER set fetches what the store lacks (fetch.py); it never compiles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import config
from ..domain import devices, narrow_build, recipe_format, scopes, sku_table
from ..domain.region import Region, Step
from ..domain.signature import Signature
from ..domain.skus import Constants, Sku
from ..errors import KernelMissing, Unsupported
from ..store import Entry, Store, recipes
from ..trust.certified import Gate
from ..trust.policy import Trust
from . import on_miss, replay
from .fetch import Fetcher
from .heap import young_only
from .libraries import Libraries


class Runtime:
    """One store and the detected SKU: recipe files and kernels, loaded on first use, kept for the process."""

    def __init__(self, store: Store, sku: Sku, constants: Constants | None = None, trust: Trust | None = None,
                 fetcher: Fetcher | None = None, gate: Gate | None = None) -> None:
        self.store, self.sku, self.trust, self.fetcher, self.gate = store, sku, trust, fetcher, gate
        self.constants = constants or sku.constants()
        # the device's constants pick, for a kernel that consumed some, the build with the device's values;
        # the gate refuses known-bad and failed kernels before their first launch (trust/certified.py)
        self.libraries = Libraries(store, sku.name, self.constants, trust, fetcher, gate)
        self._attention: dict[Signature, Attention] = {}

    def admit(self, entry: Entry) -> None:
        """Raise TrustError or KernelRefused unless the kernel object of `entry` may be loaded in this process:
        the trust policy's check of its digest (Trust.check) and the certification gate, as for every kernel this
        runtime loads (for a TIRx kernel: no signature, so the registry's call predicates cannot hold)."""
        if self.trust is not None:
            self.trust.check(entry)
        if self.gate is not None:
            self.gate.admit(entry.kernel_key, None, lambda _key: entry)

    def attention(self, sig: Signature) -> Attention:
        found = self._attention.get(sig)
        if found is None:
            if sig.num_splits > 1 and self.sku.arch == "sm_90a":  # no build can help: FA4 refuses them there
                raise Unsupported(f"num_splits={sig.num_splits} on SKU {self.sku.name}: FA4 has no split-KV kernels "
                                  "for sm_90 (it asserts 'SplitKV not supported on SM 9.0'); call with num_splits=1 "
                                  "(or 0, FA4's heuristic) on this GPU")
            with young_only():  # the recipe file's read and check: no full collection inside (heap.py)
                found = self._attention[sig] = Attention(self, sig)
        return found


_runtimes: dict[Path, Runtime] = {}


def runtime(cache_dir: Path | None = None) -> Runtime:
    """The process's Runtime for `cache_dir` (default: config.default_cache_dir()) and this GPU's SKU."""
    store = Store(cache_dir or config.default_cache_dir())
    found = _runtimes.get(store.root)
    if found is None:
        here = devices.this_device(sku_table.table(config.default_variants_file()))
        sku, constants = here.sku, here.constants
        remote = None
        if config.server_url() is not None:
            from ..remote.http import server_from_env

            remote = server_from_env()
        trust = Trust.from_env(sku, store, remote)
        fetcher = Fetcher(remote, trust, store) if remote is not None else None
        gate = Gate(store, sku.name, here.device_class, trust)
        found = _runtimes[store.root] = Runtime(store, sku, constants, trust, fetcher, gate)
    return found


class Attention:
    """One signature: its recorded regions and, per concrete sizes, the bound steps."""

    def __init__(self, rt: Runtime, sig: Signature) -> None:
        self.rt, self.sig = rt, sig
        # the file by GQA ratio without page size or window (format 3), a store's files from before it by page
        # size and window (format 2) and by head counts (format 1), then for a forward-only call the training files
        # whose forward FA4 runs for it (store.recipes.sources)
        self.sources = recipes.sources(sig, rt.sku)
        self.key = self.sources[0][0]
        self._refetched = False
        self.regions = self._load()
        self._bound: dict[tuple[Any, ...], replay.Bound] = {}

    def _load(self) -> list[recipes.Stored]:
        regions = self._read()
        if not regions and self._refetch():
            regions = self._read()
        return regions

    def _read(self) -> list[recipes.Stored]:
        """The sources' regions: each file checked as a file, and each region's guards, now; a region's steps and
        the rest when a call first selects it (recipes.load_lazy: a new signature's first call checks one region)."""
        check = self.rt.trust.check_recipe if self.rt.trust is not None else None
        found: list[recipes.Stored] = []
        for source in self.sources:
            found += source.serve(recipes.load_lazy(self.rt.store, source.key, check))
        return found

    def _refetch(self) -> bool:
        """Fetch the server's recipe file (once per signature and process): it may hold regions recorded since.
        Files are asked for in the order of `sources` until one is fetched."""
        fetcher = self.rt.fetcher
        if fetcher is None or self._refetched:
            return False
        self._refetched = True
        errors = []
        for key, _forward in self.sources:
            if fetcher.recipe(self.rt.sku.name, key):
                return True
            errors.append(fetcher.error)
        # every reason, in order: a refused file (TrustError) must not hide behind a later key's plain absence
        fetcher.error = "; ".join(dict.fromkeys(e for e in errors if e))
        return False

    def reload(self) -> None:
        """Fetch the server's recipe file again (a build has recorded regions since) and re-read the regions."""
        self._refetched = False
        self._refetch()
        self.regions = self._read()

    def sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        """A call's sizes with those its signature fixes (recipe_format.bound_sizes: the KV head count, a paged
        call's page size, a local window's sides), sizes of format-3 regions (format 2 reads the head count only:
        its file's key names the rest)."""
        return {**sizes, **recipe_format.bound_sizes(self.sig)}

    def region(self, sizes: dict[str, int]) -> Region:
        """The region whose guards hold at `sizes` (with the KV head count: Attention.sizes), checked in full before
        it is returned (StoreError when recipe_format refuses it); KernelMissing when none holds."""
        found = recipes.find(self.regions, sizes)
        if found is None and self._refetch():
            self.regions = self._load()
            found = recipes.find(self.regions, sizes)
        if found is not None:
            return found.region()
        # recorded and reported; with FA4_AOT_BUILD_WAIT, built by the server and fetched
        region = on_miss.after_miss(self, sizes)
        if region is None:
            fields = ", ".join(f"{k}={v}" for k, v in sizes.items())
            fetcher = self.rt.fetcher
            server = f" nor on the server ({fetcher.error})" if fetcher is not None and fetcher.error else ""
            raise KernelMissing(
                f"no recorded recipe of {self.sig} for {fields} on SKU {self.rt.sku.name} in {self.rt.store.root}"
                f"{server} ({len(self.regions)} region(s) recorded); build this call: {self._narrow_build(sizes)} "
                "(and `fa4-aot push`), or build the recorded miss (`fa4-aot build --from-misses`; with a builder, "
                "FA4_AOT_BUILD_WAIT=SECONDS waits for it), or use fa4_aot.install() with FA4",
                sku=self.rt.sku.name, family="recipe", kernel_key="", compile_key="")
        return region

    def _narrow_build(self, sizes: dict[str, int]) -> str:
        """The build of the one call these sizes are (domain/narrow_build.py), not the SKU's whole matrix."""
        seqlen_q = sizes.get("max_seqlen_q", sizes.get("seqlen_q", 1))
        seqlen_k = sizes.get("max_seqlen_k", sizes.get("seqlen_k", seqlen_q))
        call = self.sig.call(sizes.get("batch", 1), seqlen_q, seqlen_k)
        return narrow_build.for_call(self.rt.sku.name, call.to_dict())

    def bound(self, sizes: dict[str, int], device: Any, scale: float | None) -> replay.Bound:
        """The region at `sizes` bound for `device` and `scale`: the kernels its forward launches loaded and
        admitted by the certification gate now, those only its backward launches at the first backward
        (replay.Bound.backward), as FA4 compiles its backward kernels at its first backward; a forward never
        followed by a backward maps none of them. A server's kernels are fetched for both passes in one request
        (prefetch, which maps nothing): a training call's first backward follows its forward, and a second round
        trip there would cost it more than the bytes cost a forward that never runs one."""
        key = (*sizes.values(), device, scale)
        found = self._bound.get(key)
        if found is None:
            with young_only():  # the region's check, the kernels' loads and the bind: no full collection inside
                found = self._bound[key] = self._bind(self.sizes(sizes), device, scale)
        return found

    def _bind(self, sizes: dict[str, int], device: Any, scale: float | None) -> replay.Bound:
        region = self.region(sizes)
        used = region.launched(region.fwd + region.bwd)
        self.rt.libraries.prefetch([region.kernels[i].kernel_key for i in used])
        functions = self._functions(region, region.fwd, sizes)
        chosen = region.softmax_scale if scale is None else scale
        return replay.bind(region, sizes, functions, device, chosen,
                           lambda: self._functions(region, region.bwd, sizes))

    def _functions(self, region: Region, steps: tuple[Step, ...], sizes: dict[str, int]) -> list[Any]:
        """By kernel index, the functions of the kernels `steps` launch (None for the region's others), each
        loaded once and admitted by the certification gate for a call at `sizes` (a scoped refusal holds at some
        sizes only: domain/scopes.py); Libraries.functions raises what they raise."""
        used = region.launched(steps)
        kernels = [(region.kernels[i].kernel_key, region.kernels[i].family) for i in used]
        found: list[Any] = [None] * len(region.kernels)
        loaded = self.rt.libraries.functions(kernels, self.sig, scopes.call_sizes(sizes))
        for i, fn in zip(used, loaded, strict=True):
            found[i] = fn
        return found

    def preload(self, sizes: dict[str, int]) -> None:
        """Load every kernel the region at `sizes` launches, both passes' (KernelMissing when one is absent): a
        training region's backward kernels too, a forward-only one's (a training file's forward part) not."""
        sizes = self.sizes(sizes)
        region = self.region(sizes)
        steps = region.fwd + region.bwd
        self.rt.libraries.prefetch([region.kernels[i].kernel_key for i in region.launched(steps)])
        self._functions(region, steps, sizes)


def _function() -> Any:
    import torch

    class LeanAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, bound: replay.Bound, names: tuple[str, ...], *tensors: Any) -> Any:
            region = bound.region
            slots: list[Any] = [None] * region.tensors
            for name, t in zip(names, tensors, strict=True):
                slots[region.inputs[name]] = t
            bound.run(bound.fwd, slots)
            out, lse_slot = slots[bound.out], bound.lse
            lse = None if lse_slot is None else slots[lse_slot]
            if bound.trains:
                kept = bound.saved
                ctx.save_for_backward(*(slots[i] for i in kept))
                ctx.kept, ctx.bound, ctx.names = kept, bound, names
            if lse is not None:
                ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx: Any, dout: Any, _dlse: Any) -> Any:
            bound, region = ctx.bound, ctx.bound.region
            slots: list[Any] = [None] * region.tensors
            for i, t in zip(ctx.kept, ctx.saved_tensors, strict=True):
                slots[i] = t
            slots[region.inputs["dout"]] = dout.contiguous()
            bound.run(bound.backward(), slots)
            grads = {"q": "dq", "k": "dk", "v": "dv", "learnable_sink": "dsink"}
            return (None, None, *(slots[region.outputs[grads[n]]] if n in grads else None for n in ctx.names))

    return LeanAttention


_autograd: list[Any] = []


def run(attn: Attention, sizes: dict[str, int], tensors: dict[str, Any], scale: float | None) -> tuple[Any, Any]:
    """Forward (with autograd when the signature trains) of `attn` on named input tensors."""
    if not _autograd:
        _autograd.append(_function())
    for name in ("q", "k", "v", "page_table"):  # FA4's maybe_contiguous: a copy when the last dim is strided
        if name in tensors and tensors[name].stride(-1) != 1:
            tensors[name] = tensors[name].contiguous()
    bound = attn.bound(sizes, tensors["q"].device, scale)
    bound.check(tensors)
    if not bound.trains:  # forward only (inference, decode): no autograd node, FA4's steps run as they are
        return bound.forward(tensors)
    names = tuple(tensors)
    out: tuple[Any, Any] = _autograd[0].apply(bound, names, *tensors.values())
    return out

