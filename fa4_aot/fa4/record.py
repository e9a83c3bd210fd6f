"""Record FA4's launch recipe for one signature: what FA4's Python does per call, as data.

FA4's FlashAttnFunc / FlashAttnVarlenFunc forward (and backward, for training) run on fake tensors whose
batch and sequence lengths are torch symbols (a ShapeEnv). Every torch op FA4 issues (allocations, zero
fills, views) is traced by a dispatch mode, and every compiled-kernel call it makes is captured by the
compile-cache recorder with its full argument list; sizes in both stay symbolic. The KV head count is a size
too (the query heads are the signature's GQA ratio times it), and so are the values FA4 passes to its kernels at
run time (a paged call's page size, a local window's sides: recipe_format.bound_sizes), so every branch FA4 takes
on a size, a head count, a page size or a window (tile choice, q_stage, pack_gqa, 2-CTA, paged TMA, split
heuristics, the compile key itself) becomes a ShapeEnv guard: the recipe holds exactly where those guards hold,
so replaying it (fa4_aot/runtime/replay.py) is FA4's own decision.

Run only in a process configured for the target SKU (target.configure), as the build workers are.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..domain.kernel_keys import canonical, kernel_key
from ..domain.recipe_format import HEADS, PAGE_SIZE, RECIPE_FORMAT, SIZE_NAMES, WINDOW, bound_sizes, size_names
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Sku
from . import caches
from .dispatch import _Ctx
from .host_trace import LaunchRecorder, Session, tracer
from .symbolic import launching
from .versions import toolchain


def record(sig: Signature, sizes: dict[str, int], sku: Sku, symbolic: bool = True,
           defaults: tuple[str, ...] = ()) -> Region:
    """The recipe of `sig` for the region of sizes containing `sizes` (names: recipe_format.size_names(layout); the KV
    head count, page size and window default to the signature's (recipe_format.bound_sizes), the query heads are
    always the signature's GQA ratio times the KV heads).
    With symbolic=False, FA4 runs at exactly `sizes`: what it does there, for comparing with a replay; the
    size arguments named in `defaults` (max_seqlen_q/k of seqused and paged calls) are then left to FA4.
    Raises Refused where FA4 refuses the call, with the guards under which it does; ValueError if what FA4 did
    is not a region clients would admit (Region.parse: a recorder fault, never a stored file)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if sig.layout not in SIZE_NAMES:
        raise ValueError(f"layout {sig.layout!r} has no lean recipe (known: {', '.join(SIZE_NAMES)})")
    sizes = {**bound_sizes(sig), **sizes}
    session = Session(ShapeEnv(duck_shape=False, specialize_zero_one=False), 1.0 / math.sqrt(sig.head_dim), symbolic)
    try:
        inputs, fwd, bwd, outputs = _trace(sig, sizes, session, defaults)
    except Exception as e:
        raise Refused(e, _guards_or_none(session)) from e
    return Region.parse({
        "format": RECIPE_FORMAT, "signature": _at(sig, sizes).to_dict(),
        "guards": session.guards() + _pinned(sig, sizes),
        "inputs": {name: session.ref(t) for name, t in inputs.items() if isinstance(t, torch.Tensor)},
        "tensors": len(session.keep), "meta": session.meta, "fwd": fwd, "bwd": bwd, "outputs": outputs,
        "softmax_scale": session.scale,
        "kernels": [{"family": f, "compile_key": canonical(k), "kernel_key": kernel_key(f, k, sku, toolchain())}
                    for f, k in session.kernels],
        "recorded_at": dict(sizes), "toolchain": toolchain(),
    })


class Refused(Exception):
    """FA4 refused a call (an assertion, a layout limit) while recording: `guards` (None if they could not be
    read) are the ShapeEnv's guards up to the refusal, where FA4 takes the same path to the same refusal."""

    def __init__(self, error: Exception, guards: list[Any] | None) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.guards = guards


def _symbolic(sig: Signature, name: str, value: int) -> bool:
    """Whether size `name` is a symbol of the recording: every size of the layout; a window side only for a local
    window and only when not negative (a size symbol is >= 0; FA4 reads a negative side as it is, so such a region
    is pinned to it: _pinned)."""
    if name in WINDOW:
        return sig.mask == "local" and value >= 0
    return name != PAGE_SIZE or sig.layout == "paged"


def _at(sig: Signature, sizes: dict[str, int]) -> Signature:
    """`sig` with the page size and window it was recorded at (a build explores a paged signature at page size 1
    too): what a region's signature says is what it was recorded for (its file's key names neither)."""
    if sig.layout == "paged":
        sig = dataclasses.replace(sig, page_size=sizes[PAGE_SIZE])
    if sig.mask == "local":
        sig = dataclasses.replace(sig, window=(sizes[WINDOW[0]], sizes[WINDOW[1]]))
    return sig


def _pinned(sig: Signature, sizes: dict[str, int]) -> list[Any]:
    """Guards pinning the window sides recorded as constants (negative ones) to their values."""
    return [["eq", ["sym", name], sizes[name]] for name in WINDOW
            if sig.mask == "local" and not _symbolic(sig, name, sizes[name])]


def _guards_or_none(session: Session) -> list[Any] | None:
    try:
        return session.guards()
    except Exception:  # a guard the encoder cannot write: the refusal holds only where it was met
        return None


def _trace(sig: Signature, sizes: dict[str, int], session: Session, defaults: tuple[str, ...]
           ) -> tuple[dict[str, Any], list[Any], list[Any], dict[str, Any]]:
    """FA4's forward (and backward) of `sig` at symbolic `sizes` under the tracer: (inputs, fwd steps, bwd steps,
    outputs by name)."""
    import torch
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: dict[tuple[str, str], Any] = {}
    mode = FakeTensorMode(shape_env=session.env)
    # torch's fake-tensor cache, on symbolic sizes, costs more than it saves (keys and outputs rebuilt per op: two
    # thirds of recording's CPU) and its metadata checks add guards of its own (`batch != 1`, ...) that no choice
    # of FA4's makes: without it a region is recorded in a third of the CPU and holds at least as widely
    # (the differential tests judge the regions)
    mode.cache_enabled = False
    with mode, launching(interface), \
            caches.swapped(lambda family, _old: LaunchRecorder(family, session, seen)):
        dims = {name: session.size(name, sizes[name]) if _symbolic(sig, name, sizes.get(name, 0)) else sizes.get(name)
                for name in size_names(sig.layout)}
        inputs, fn, kwargs = _inputs(sig, dims, session, torch, defaults)
        ctx = _Ctx()
        with torch.no_grad():
            with tracer(session):
                out, lse = fn.forward(ctx, inputs["q"], inputs["k"], inputs["v"], **kwargs)
            fwd, session.steps = session.steps, []
            outputs = {"out": session.ref(out), "lse": None if lse is None else session.ref(lse)}
            bwd: list[Any] = []
            if sig.pass_ in ("bwd", "bwd_det"):
                dout = torch.empty_like(out)
                inputs["dout"] = dout
                session.ref(dout, new=True)
                with tracer(session):
                    grads = fn.backward(ctx, dout, None)
                bwd = session.steps
                for name, g in zip(("dq", "dk", "dv"), grads[:3], strict=True):
                    outputs[name] = session.ref(g)
                if sig.sink:
                    outputs["dsink"] = session.ref(grads[_grad_index(fn, "learnable_sink")])
    return inputs, fwd, bwd, outputs


def _grad_index(fn: Any, name: str) -> int:
    """Where backward() returns the gradient of forward's argument `name` (its position after ctx)."""
    import inspect

    return list(inspect.signature(fn.forward).parameters).index(name) - 1


def _inputs(sig: Signature, dims: dict[str, Any], session: Session, torch: Any,
            defaults: tuple[str, ...] = ()) -> tuple[dict[str, Any], Any, Any]:
    """FA4's arguments for `sig` at `dims`: (input tensors by name, FA4's autograd Function, its keyword
    arguments); the names in `defaults` (max_seqlen_q/k) are passed as None."""
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    if sig.heads_kv <= 0 or sig.heads_q % sig.heads_kv:
        raise ValueError(f"{sig}: FA4 needs the query heads to be a multiple of the KV heads")
    hq = sig.heads_q // sig.heads_kv * dims[HEADS]
    tensor = _tensors(sig, session, torch)
    inputs = _layout_inputs(sig, dims, hq, tensor, torch.int32)
    kwargs: dict[str, Any] = {
        "softmax_scale": session.scale, "causal": sig.mask == "causal",
        "window_size": tuple(dims[w] for w in WINDOW) if sig.mask == "local" else (None, None),
        "softcap": sig.softcap,
        "num_splits": sig.num_splits, "deterministic": sig.pass_ == "bwd_det", "return_lse": sig.pass_ == "fwd_lse",
    }
    kwargs.update({name: t for name, t in inputs.items() if name not in ("q", "k", "v")})
    kwargs.update({name: dims[name] for name in ("max_seqlen_q", "max_seqlen_k") if name in dims})
    for name in defaults:  # FA4 without these arguments: the same choices as with their default values
        kwargs[name] = None
    if sig.sink:
        kwargs["learnable_sink"] = inputs["learnable_sink"] = tensor(hq)
    return inputs, FlashAttnFunc if sig.layout == "dense" else FlashAttnVarlenFunc, kwargs


def _tensors(sig: Signature, session: Session, torch: Any) -> Any:
    """tensor(*shape, dt=...): a fake CUDA tensor of the signature's dtype (requiring grad when it trains) or of
    `dt`, given a slot."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[sig.dtype]
    grad = sig.pass_ in ("bwd", "bwd_det")

    def tensor(*shape: Any, dt: Any = dtype) -> Any:
        t = torch.empty(*shape, dtype=dt, device="cuda")
        t = t.requires_grad_(grad) if dt is dtype else t
        session.ref(t, new=True)
        return t

    return tensor


def _layout_inputs(sig: Signature, dims: dict[str, Any], hq: Any, tensor: Any, int32: Any) -> dict[str, Any]:
    """q, k, v and the layout's index tensors at `dims` (`hq` query heads)."""
    hkv, d, dv, b = dims[HEADS], sig.head_dim, sig.head_dim_v, dims["batch"]
    if sig.layout == "varlen":
        return {"q": tensor(dims["total_q"], hq, d), "k": tensor(dims["total_k"], hkv, d),
                "v": tensor(dims["total_k"], hkv, dv), "cu_seqlens_q": tensor(b + 1, dt=int32),
                "cu_seqlens_k": tensor(b + 1, dt=int32)}
    if sig.layout == "paged":
        pool = (dims["num_pages"], dims[PAGE_SIZE], hkv)
        return {"q": tensor(b, dims["seqlen_q"], hq, d), "k": tensor(*pool, d), "v": tensor(*pool, dv),
                "page_table": tensor(b, dims["pages_per_seq"], dt=int32), "seqused_k": tensor(b, dt=int32)}
    sq, sk = dims["seqlen_q"], dims["seqlen_k"]  # dense, seqused
    inputs = {"q": tensor(b, sq, hq, d), "k": tensor(b, sk, hkv, d), "v": tensor(b, sk, hkv, dv)}
    if sig.layout == "seqused":
        inputs["seqused_k"] = tensor(b, dt=int32)
    return inputs
