"""Run in a fresh process configured for one SKU: random calls of signature classes through the lean runtime's
real entry points and through FA4's own, on the same fake CUDA tensors; every kernel launch compared.

argv: SKU, seed, JSON list of classes (tests/runtime/test_lean_differential.py draws them). Prints one JSON report:
per class the calls compared, those outside every recorded region (KernelMissing on the lean side, then
recorded as `build --from-misses` would and compared), those FA4 rejects, and every mismatch with its call.

The lean side is fa4_aot.flash_attn_func / flash_attn_varlen_func over a temp store. The first time it asks for a
recipe file (a signature's GQA ratio) at a KV head count, the store gets the regions a build records for the
signature at that head count (compile.lean.explore over its whole size space,
compile.lean.save; for some forward classes, with or without LSE, those of the training signature instead); every
kernel is a stub
that notes its key and arguments (window_probe._Stubs). FA4's side is flash_attn.cute's flash_attn_func /
flash_attn_varlen_func under compile caches that note the same (window_probe._fa4_launching). Training calls:
autograd on fake CUDA tensors aborts the process on a host without CUDA (building an AccumulateGrad node asks for a
CUDA device guard), so both autograd Functions' apply is replaced by one that drives the Function's own forward and
then its backward with a stand-in ctx, under no_grad: FA4's FlashAttnFunc/FlashAttnVarlenFunc and the lean runtime's
LeanAttention run their real code, only torch's autograd engine is left out. Outputs and gradients are compared as
shape, stride and dtype.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fa4_aot.domain.probes import MAX_SEQLEN_K, MAX_SEQLEN_Q
from fa4_aot.fa4.dispatch import _Ctx  # the stand-in for autograd's ctx FA4's forward and backward are driven with
from tests.runtime.window_probe import _fa4_launching, _plain, _Stubs


def main() -> None:
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4
    from fa4_aot.matrix import variants

    sku = variants.load(config.default_variants_file()).skus[sys.argv[1]]
    fa4.configure(sku)
    seed, classes = int(sys.argv[2]), json.loads(sys.argv[3])
    with tempfile.TemporaryDirectory() as tmp, _lean_runtime(sku, Path(tmp)) as rt:
        report = [_run_class(rt, sku, cls, random.Random(f"{seed}:{cls['index']}")) for cls in classes]
    print(json.dumps(report))


def _driver(function: Any, grads: dict[str, Any], names: Any) -> Any:
    """A stand-in for `function` whose apply runs forward and, when the call trains, backward with dout of out's
    layout; `names(args)` names the inputs whose gradients backward returns, noted into `grads`."""
    import torch

    class Driver:
        @staticmethod
        def apply(*args: Any) -> Any:
            ctx = _Ctx()
            with torch.no_grad():
                out, lse = function.forward(ctx, *args)
                if grads.get("train"):
                    found = function.backward(ctx, torch.empty_like(out), None)
                    grads.update({n: g for n, g in zip(names(args), found, strict=False) if n is not None})
            return out, lse

    return Driver


class _Recording:
    """The lean runtime over a temp store that a build fills, for each signature the entry point asks for."""

    def __init__(self, rt: Any, sku: Any) -> None:
        from fa4_aot.compile.lean import Worker
        from fa4_aot.fa4.versions import toolchain

        self.rt, self.sku = rt, sku
        self.worker = Worker(sku, rt.store, rt.store, toolchain())
        self.asked: list[Any] = []  # [Attention, sizes] of the last region lookup
        self.built_as: str | None = None  # the pass a build records for a forward signature (its training one)

    def build(self, sig: Any) -> None:
        """What a build of `sig` records: regions covering its whole size space (compile.lean.explore); with
        `built_as`, those of the training signature instead, with its forward without LSE (a model built for
        training, run forward)."""
        import dataclasses

        from fa4_aot.compile import lean as build_lean
        from fa4_aot.domain import probes

        sig = dataclasses.replace(sig, pass_=self.built_as) if self.built_as else sig
        recorded: dict[str, list[Any]] = {}
        for each in (sig, *probes.forward_of(sig)):
            build_lean.explore(self.worker, each, recorded)
        build_lean.save(self.rt.store, recorded)

    def record_miss(self) -> None:
        """Record the region at the sizes of the last lookup, as `build --from-misses` would, and reload."""
        from fa4_aot import fa4
        from fa4_aot.store import recipes

        attn, sizes = self.asked
        recipes.merge(self.rt.store, attn.key, [fa4.record_recipe(attn.sig, sizes, self.sku)])
        attn.regions = attn._load()


@contextmanager
def _lean_runtime(sku: Any, root: Path) -> Iterator[_Recording]:
    from fa4_aot.runtime import api
    from fa4_aot.runtime import runner as lean
    from fa4_aot.store import Store, recipes

    built: set[Any] = set()

    class Runtime(lean.Runtime):
        def attention(self, sig: Any) -> Any:
            # a file per GQA ratio, built as a build of each head count a class calls with (a model at two TP
            # degrees) records it: the second head count's build records only what the first's regions leave out
            key = (recipes.recipe_key(sig, sku), sig.heads_kv)
            if key not in built:
                built.add(key)
                recording.build(sig)
            return super().attention(sig)

    rt = Runtime(Store(root), sku)
    recording = _Recording(rt, sku)
    rt.libraries = _Stubs([])
    region = lean.Attention.region

    def noting(self: Any, sizes: dict[str, int]) -> Any:
        recording.asked[:] = [self, dict(sizes)]
        return region(self, sizes)

    before = lean.runtime, lean.Attention.region
    lean.runtime, lean.Attention.region = (lambda cache_dir=None: rt), noting
    api._cache.clear()
    try:
        yield recording
    finally:
        lean.runtime, lean.Attention.region = before


def _run_class(recording: _Recording, sku: Any, cls: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    from fa4_aot.errors import KernelMissing

    recording.built_as = cls.get("built_as")
    started = time.monotonic()
    found = {"index": cls["index"], "compared": 0, "outside": 0, "rejected": 0, "shorter": 0, "mismatches": [],
             "outside_calls": []}
    for _ in range(cls["calls"]):
        call = _random_call(cls, rng)
        try:
            verdict = _compare(recording, call)
            if verdict == "outside":
                unbuilt = _training_refused(recording)
                verdict = _after_miss(recording, call)
                # where FA4 refuses the call, no region is right; nor where a class built for training is called
                # at sizes FA4 refuses to train at (its planner never reaches them either)
                if verdict != "rejected" and not unbuilt:
                    found["outside"] += 1
                    found["outside_calls"].append(call)
        except KernelMissing as e:
            verdict = f"no region holds where one was just recorded: {e}"
        except Exception as e:
            verdict = f"probe error {e!r}: {traceback.format_exc()[-1500:]}"
        if verdict == "rejected":
            found["rejected"] += 1
        elif verdict:
            found["mismatches"].append({"call": call, "why": verdict})
        else:
            found["compared"] += 1
            found["shorter"] += _window_bites(call)
    found["seconds"] = round(time.monotonic() - started, 1)  # its builds' exploring most of it
    return found


def _training_refused(recording: _Recording) -> bool:
    """Whether the class is built for training and FA4 refuses to train at the last lookup's sizes."""
    import dataclasses

    from fa4_aot import fa4

    if not recording.built_as:
        return False
    attn, sizes = recording.asked
    try:
        fa4.record_recipe(dataclasses.replace(attn.sig, pass_=recording.built_as), sizes, recording.sku)
    except Exception:
        return True
    return False


def _after_miss(recording: _Recording, call: dict[str, Any]) -> str:
    """The verdict on a call outside every region once its region is recorded; where FA4 cannot record one
    (it rejects these sizes), FA4's own call must raise too."""
    try:
        recording.record_miss()
    except Exception as e:
        fa4_side, _launched = _launches(recording, call, "fa4")
        return "rejected" if isinstance(fa4_side, Exception) else f"recording fails ({e!r}) where FA4 runs"
    return _compare(recording, call)


def _window_bites(call: dict[str, Any]) -> bool:
    """Whether the call's local window is shorter than its key sequence (so it masks more than causal does)."""
    if call["window"] is None:
        return False
    left, right = call["window"]
    span = call["sizes"].get("seqlen_k") or call["sizes"].get("max_seqlen_k") or 0
    return 0 <= left < span - 1 or 0 < right < span - 1


def _compare(recording: _Recording, call: dict[str, Any]) -> str:
    """'' when both sides launch alike, 'outside' when the lean side has no region (and launched nothing),
    'rejected' when FA4 raises and the lean side raises too, else what differs."""
    from fa4_aot.errors import KernelMissing

    (lean_side, launched), (fa4_side, _l) = _launches(recording, call, "lean"), _launches(recording, call, "fa4")
    if isinstance(lean_side, KernelMissing):
        return "outside" if launched == [] else "launched before KernelMissing"
    if isinstance(fa4_side, Exception):
        return "rejected" if isinstance(lean_side, Exception) else f"lean ran where FA4 raises {fa4_side!r}"
    if isinstance(lean_side, Exception):
        return f"lean raises {lean_side!r} where FA4 runs"
    return _difference(lean_side, fa4_side)


def _difference(lean: dict[str, Any], fa4: dict[str, Any]) -> str:
    if [k for k, _a in lean["launches"]] != [k for k, _a in fa4["launches"]]:
        return (f"kernels {[k[:12] for k, _a in lean['launches']]} where FA4 launches "
                f"{[k[:12] for k, _a in fa4['launches']]}")
    for i, ((key, mine), (_k, theirs)) in enumerate(zip(lean["launches"], fa4["launches"], strict=True)):
        if mine != theirs:
            j = next((j for j, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                     min(len(mine), len(theirs)))
            return f"launch {i} ({key[:12]}) argument {j}: {mine[j:j + 1]} where FA4 passes {theirs[j:j + 1]}"
    for name in sorted(set(lean["results"]) | set(fa4["results"])):
        if lean["results"].get(name) != fa4["results"].get(name):
            return f"{name}: {lean['results'].get(name)} where FA4 returns {fa4['results'].get(name)}"
    return ""


def _launches(recording: _Recording, call: dict[str, Any], side: str) -> tuple[Any, list[Any]]:
    """({"launches", "results"} of `call` on one side, or the exception it raised; the launches made)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    launches: list[Any] = []
    recording.rt.libraries.launches = launches
    grads: dict[str, Any] = {"train": call["train"]}
    try:
        with FakeTensorMode(), torch.set_grad_enabled(not call["no_grad"]):
            tensors = _tensors(call, torch)
            with _entry(side, recording.sku, grads, launches) as fn:
                out, lse = fn(**tensors, **call["kwargs"])
    except Exception as e:
        return e, launches
    results = {"out": _plain(out), "lse": _plain(lse)}
    results.update({f"d{n}": _plain(grads.get(n)) for n in ("q", "k", "v", "learnable_sink") if call["train"]})
    return {"launches": launches, "results": results}, launches


@contextmanager
def _entry(side: str, sku: Any, grads: dict[str, Any], launches: list[Any]) -> Iterator[Any]:
    """The entry point of `side` for a call with or without cu_seqlens/seqused_k, its autograd driven directly."""
    if side == "lean":
        import fa4_aot
        from fa4_aot.runtime import runner as lean

        function = lean._function()
        lean._autograd[:] = [_driver(function, grads, lambda args: [None, None, *args[1]])]

        def lean_fn(**kw: Any) -> Any:
            dense = not any(n in kw for n in ("cu_seqlens_q", "seqused_k"))
            return (fa4_aot.flash_attn_func if dense else fa4_aot.flash_attn_varlen_func)(**kw)

        yield lean_fn
        return
    from flash_attn.cute import interface

    dense, varlen = interface.FlashAttnFunc, interface.FlashAttnVarlenFunc
    names = {f: list(inspect.signature(f.forward).parameters)[1:] for f in (dense, varlen)}
    interface.FlashAttnFunc = _driver(dense, grads, lambda args: names[dense])
    interface.FlashAttnVarlenFunc = _driver(varlen, grads, lambda args: names[varlen])
    try:
        with _fa4_launching(sku, launches):
            def fa4_fn(**kw: Any) -> Any:
                dense_call = not any(n in kw for n in ("cu_seqlens_q", "seqused_k"))
                return (interface.flash_attn_func if dense_call else interface.flash_attn_varlen_func)(**kw)

            yield fa4_fn
    finally:
        interface.FlashAttnFunc, interface.FlashAttnVarlenFunc = dense, varlen


def _tensors(call: dict[str, Any], torch: Any) -> dict[str, Any]:
    """The call's tensors (fake, on 'cuda'): q, k, v with gradients when it trains; int32 metadata; sink."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[call["dtype"]]
    grad = call["train"] or call["no_grad"]

    def make(shape: list[int], dt: Any = dtype) -> Any:
        t = torch.empty(*shape, dtype=dt, device="cuda")
        return t.requires_grad_(True) if grad and dt is dtype else t

    found = {name: make(shape) for name, shape in call["shapes"].items()}
    found.update({name: make(shape, torch.int32) for name, shape in call["ints"].items()})
    return found


def _random_call(cls: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A random call of the class: its sizes, one of the spellings FA4 reads as the class's mask, a scale or
    none, max lengths or FA4's defaults; JSON, so that a failure prints it."""
    hkv, d, dv, layout = rng.choice(cls["kv_heads"]), cls["head_dim"], cls["head_dim_v"], cls["layout"]
    hq = cls["ratio"] * hkv
    sizes = _random_sizes(cls, rng)
    b = sizes["batch"]
    kwargs: dict[str, Any] = {
        "softmax_scale": rng.choice([None, round(rng.uniform(0.01, 0.3), 6)]), "softcap": cls["softcap"],
        "num_splits": cls["num_splits"], "deterministic": cls["pass_"] == "bwd_det",
        "return_lse": cls["pass_"] == "fwd_lse", **_spelling(cls, rng)}
    if layout == "varlen":
        shapes = {"q": [sizes["total_q"], hq, d], "k": [sizes["total_k"], hkv, d], "v": [sizes["total_k"], hkv, dv]}
        ints = {"cu_seqlens_q": [b + 1], "cu_seqlens_k": [b + 1]}
        kwargs.update(max_seqlen_q=sizes["max_seqlen_q"], max_seqlen_k=sizes["max_seqlen_k"])
    elif layout == "paged":
        pool = [sizes["num_pages"], cls["page_size"], hkv]
        shapes = {"q": [b, sizes["seqlen_q"], hq, d], "k": [*pool, d], "v": [*pool, dv]}
        ints = {"page_table": [b, sizes["pages_per_seq"]], "seqused_k": [b]}
    else:
        shapes = {"q": [b, sizes["seqlen_q"], hq, d], "k": [b, sizes["seqlen_k"], hkv, d],
                  "v": [b, sizes["seqlen_k"], hkv, dv]}
        ints = {"seqused_k": [b]} if layout == "seqused" else {}
    if layout in ("seqused", "paged"):  # FA4's defaults (None) or the caller's bounds
        kwargs.update({n: rng.choice([None, sizes[n]]) for n in ("max_seqlen_q", "max_seqlen_k")})
    if cls["sink"]:
        shapes["learnable_sink"] = [hq]
    train = cls["pass_"] in ("bwd", "bwd_det")
    # inputs that require grad, run under no_grad: FA4 then computes LSE as for training (a forward with LSE)
    return {"class": cls["index"], "dtype": cls["dtype"], "train": train,
            "no_grad": not train and rng.random() < 0.2,
            "sizes": sizes, "shapes": shapes, "ints": ints, "kwargs": kwargs,
            "window": cls["window"] if cls["mask"] == "local" else None}


def _spelling(cls: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """causal and window_size as a caller may write the class's mask; FA4 reads each as that mask
    (interface._resolve_causal_local_window): negative pairs are no window, causal zeroes the right side."""
    left, right = cls["window"]
    if cls["mask"] == "full":
        options = [(False, (None, None)), (False, (-1, -1)), (False, (-1, -8))]
    elif cls["mask"] == "causal":
        options = [(True, (None, None)), (True, (-1, -1)), (True, (None, 0)), (False, (None, 0)), (True, (None, 64))]
    elif right == 0:
        options = [(False, (left, 0)), (True, (left, 0)), (True, (left, rng.randint(1, 512)))]
    else:
        options = [(False, (left, right))]
    causal, window = rng.choice(options)
    return {"causal": causal, "window_size": list(window)}


def _length(rng: random.Random, around: int, most: int) -> int:
    """A sequence length up to `most`: 1, short, near `around` (a window's span) on either side, up to 20k, or
    anywhere in the whole range (log-uniform: every tile, split and batch regime FA4 tells apart)."""
    pick = rng.random()
    if pick < 0.1:
        return 1
    if pick < 0.3:
        return rng.randint(1, 300)
    if pick < 0.5 and around > 0:
        return max(1, around + rng.randint(-around // 2, 2 * around))
    if pick < 0.65:
        return rng.randint(1, 20000)
    return min(most, int(math.exp(rng.uniform(0, math.log(most + 1)))))


def _random_sizes(cls: dict[str, Any], rng: random.Random) -> dict[str, int]:
    layout, span = cls["layout"], max(cls["window"]) if cls["mask"] == "local" else 0
    batch = rng.choice([1, 2, 3, rng.randint(1, 64), rng.randint(1, 600), int(math.exp(rng.uniform(0, 10)))])
    sq = _length(rng, span, MAX_SEQLEN_Q)
    sk = rng.choice([sq, _length(rng, span, MAX_SEQLEN_K), _length(rng, span, MAX_SEQLEN_K)])
    if layout == "dense":
        return {"batch": batch, "seqlen_q": sq, "seqlen_k": sk}
    if layout == "varlen":
        return {"batch": batch, "total_q": rng.randint(batch, batch * sq) if sq > 1 else batch,
                "total_k": rng.randint(batch, batch * sk) if sk > 1 else batch, "max_seqlen_q": sq,
                "max_seqlen_k": sk}
    if layout == "paged":  # decode: a few query tokens over a shared pool of pages
        page, sq = cls["page_size"], rng.choice([1, 1, rng.randint(1, 8), sq])
        pages = max(1, -(-sk // page))
        pool = rng.choice([batch * pages, rng.randint(1, 4 * batch * pages)])
        return {"batch": batch, "seqlen_q": sq, "num_pages": pool, "pages_per_seq": pages, "max_seqlen_q": sq,
                "max_seqlen_k": rng.choice([pages * page, rng.randint(1, pages * page)])}
    return {"batch": batch, "seqlen_q": sq, "seqlen_k": sk, "max_seqlen_q": sq,
            "max_seqlen_k": rng.choice([sk, rng.randint(1, sk)])}


if __name__ == "__main__":
    main()
