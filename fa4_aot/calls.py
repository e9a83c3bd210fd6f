"""A concrete FlashAttention-4 call (shapes and flags), and running it through FA4's own entry points.

`Call` is a value object. `run()` drives FlashAttnFunc / FlashAttnVarlenFunc exactly as autograd would
(forward, then backward for training passes) so that FA4's own dispatch picks tile sizes, q_stage,
pack_gqa, split-KV and 2-CTA. Under FakeTensorMode FA4 launches nothing; with a recording cache in
place (see caches.py) a run lists the kernels the call needs without compiling anything.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, cast

DTYPES = ("bf16", "fp16")
LAYOUTS = ("dense", "varlen", "seqused", "paged")
PASSES = ("fwd", "fwd_lse", "bwd", "bwd_det")
MASKS = ("full", "causal", "local")


@dataclass(frozen=True)
class Call:
    layout: str
    pass_: str
    dtype: str
    head_dim: int
    head_dim_v: int
    mask: str
    window: tuple[int, int]
    softcap: float
    sink: bool
    num_splits: int
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    page_size: int = 0

    @property
    def training(self) -> bool:
        return self.pass_ in ("bwd", "bwd_det")

    def describe(self) -> str:
        extras = [f"window={list(self.window)}" if self.mask == "local" else ""]
        extras += [f"softcap={self.softcap}" if self.softcap else "", "sink" if self.sink else ""]
        extras += [f"num_splits={self.num_splits}" if self.num_splits != 1 else ""]
        extras += [f"page_size={self.page_size}" if self.layout == "paged" else ""]
        dims = f"{self.head_dim}" if self.head_dim == self.head_dim_v else f"{self.head_dim}x{self.head_dim_v}"
        return " ".join(
            [f"{self.pass_} {self.layout} {self.dtype} d={dims} {self.mask}",
             f"b={self.batch} sq={self.seqlen_q} sk={self.seqlen_k} h={self.heads_q}/{self.heads_kv}"]
            + [e for e in extras if e]
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Ctx:
    """Stands in for autograd's ctx so that FA4's forward and backward can be driven directly."""

    saved_tensors: tuple[Any, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def set_materialize_grads(self, value: bool) -> None:
        pass


def run(call: Call) -> None:
    """Run `call` through FA4 on tensors on the 'cuda' device. Callers wrap this in FakeTensorMode
    (planning, building) or in a real CUDA context with real caches (loading)."""
    import torch
    from flash_attn.cute import interface

    args, kwargs, fn = _arguments(call, torch)
    ctx = _Ctx()
    with torch.no_grad():
        out = fn.forward(ctx, *args, **kwargs)
        if call.training:
            o = out[0] if isinstance(out, tuple) else out
            fn.backward(ctx, torch.empty_like(o), None)
    del interface  # imported above only to make sure FA4 is configured before tensors are built


def _arguments(call: Call, torch: Any) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[call.dtype]
    grad = call.training

    def tensor(*shape: int, dt: Any = dtype) -> Any:
        t = torch.empty(*shape, dtype=dt, device="cuda")
        return t.requires_grad_(grad) if dt in (torch.bfloat16, torch.float16) else t

    b, sq, sk, hq, hkv = call.batch, call.seqlen_q, call.seqlen_k, call.heads_q, call.heads_kv
    d, dv = call.head_dim, call.head_dim_v
    kwargs: dict[str, Any] = {
        "causal": call.mask == "causal",
        "window_size": tuple(call.window) if call.mask == "local" else (None, None),
        "softcap": call.softcap,
        "learnable_sink": tensor(hq) if call.sink else None,
        "num_splits": call.num_splits,
        "deterministic": call.pass_ == "bwd_det",
        "return_lse": call.pass_ == "fwd_lse",
    }
    int32 = torch.int32
    if call.layout == "dense":
        return (tensor(b, sq, hq, d), tensor(b, sk, hkv, d), tensor(b, sk, hkv, dv)), kwargs, FlashAttnFunc
    if call.layout == "varlen":
        kwargs.update(
            cu_seqlens_q=tensor(b + 1, dt=int32), cu_seqlens_k=tensor(b + 1, dt=int32),
            max_seqlen_q=sq, max_seqlen_k=sk,
        )
        return (tensor(b * sq, hq, d), tensor(b * sk, hkv, d), tensor(b * sk, hkv, dv)), kwargs, FlashAttnVarlenFunc
    kwargs["seqused_k"] = tensor(b, dt=int32)
    if call.layout == "seqused":
        return (tensor(b, sq, hq, d), tensor(b, sk, hkv, d), tensor(b, sk, hkv, dv)), kwargs, FlashAttnVarlenFunc
    pages_per_seq = -(-sk // call.page_size)
    kwargs["page_table"] = tensor(b, pages_per_seq, dt=int32)
    pages = b * pages_per_seq
    k = tensor(pages, call.page_size, hkv, d)
    v = tensor(pages, call.page_size, hkv, dv)
    return (tensor(b, sq, hq, d), k, v), kwargs, FlashAttnVarlenFunc


# -- the other direction: which Call is FA4 running? ---------------------------------------------
# fa4_aot.install() wraps FA4's autograd functions so that a kernel missing from the store can be
# reported with the Call that needed it; `fa4-aot build --from-misses` then builds exactly that call.
_current = threading.local()


def current() -> Call | None:
    """The Call FA4 is running on this thread, when install() could describe it, else None."""
    return getattr(_current, "call", None)


@contextmanager
def running(call: Call | None) -> Iterator[None]:
    previous, _current.call = current(), call
    try:
        yield
    finally:
        _current.call = previous


def capture() -> None:
    """Wrap FlashAttnFunc and FlashAttnVarlenFunc (forward and backward) so that current() describes the call.
    Idempotent. Calls this module cannot describe (score_mod, block sparsity, MLA...) run with current() None."""
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    for fn, layout in ((FlashAttnFunc, "dense"), (FlashAttnVarlenFunc, "varlen")):
        if getattr(fn.forward, "_fa4_aot_wrapped", False):
            continue
        fn.forward = staticmethod(_wrap_forward(fn.forward, layout))
        fn.backward = staticmethod(_wrap_backward(fn.backward))


def _wrap_forward(forward: Any, layout: str) -> Any:
    signature = inspect.signature(forward)

    def wrapped(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            call = from_arguments(layout, signature.bind(ctx, *args, **kwargs).arguments)
        except Exception:  # describing the call must never break it
            call = None
        ctx._fa4_aot_call = call
        if call is not None:
            from . import record

            record.note(call)
        with running(call):
            return forward(ctx, *args, **kwargs)

    wrapped._fa4_aot_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def _wrap_backward(backward: Any) -> Any:
    def wrapped(ctx: Any, *args: Any) -> Any:
        with running(getattr(ctx, "_fa4_aot_call", None)):
            return backward(ctx, *args)

    return wrapped


def from_arguments(layout: str, a: dict[str, Any]) -> Call | None:
    """The Call behind FA4 forward arguments `a` (as bound to FlashAttn[Varlen]Func.forward), or None."""
    import torch

    unsupported = ("qv", "gather_kv_indices", "score_mod", "mask_mod", "block_sparse_tensors", "aux_tensors")
    if any(a.get(name) is not None for name in unsupported):
        return None
    q, k, v = a["q"], a["k"], a["v"]
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(q.dtype)
    window = a.get("window_size") or (None, None)
    if dtype is None or (window != (None, None) and None in window):
        return None
    left, right = cast(tuple[int, int], window) if window != (None, None) else (0, 0)
    # FA4 keeps LSE and compiles the training kernels when any input requires grad (its own `requires_grad`),
    # whatever the grad mode: autograd runs Function.forward with grad disabled, so is_grad_enabled() is False
    # here even inside a training step (which recorded training misses as "fwd").
    training = any(t is not None and t.requires_grad for t in (q, k, v, a.get("learnable_sink")))
    layout, batch, sq, sk, page = _layout_shape(layout, a, q, k)
    return Call(
        layout=layout, pass_=("bwd_det" if a.get("deterministic") else "bwd") if training
        else ("fwd_lse" if a.get("return_lse") else "fwd"),
        dtype=dtype, head_dim=q.shape[-1], head_dim_v=v.shape[-1],
        mask="causal" if a.get("causal") else "local" if window != (None, None) else "full",
        window=(int(left), int(right)),
        softcap=float(a.get("softcap") or 0.0), sink=a.get("learnable_sink") is not None,
        num_splits=int(a.get("num_splits", 1)), batch=batch, seqlen_q=sq, seqlen_k=sk, heads_q=q.shape[-2],
        heads_kv=k.shape[-2], page_size=page,
    )


def _layout_shape(layout: str, a: dict[str, Any], q: Any, k: Any) -> tuple[str, int, int, int, int]:
    """(layout, batch, seqlen_q, seqlen_k, page_size) in Call's logical terms."""
    if layout == "dense":
        return "dense", q.shape[0], q.shape[1], k.shape[1], 0
    if a.get("page_table") is not None:
        table = a["page_table"]
        return "paged", table.shape[0], q.shape[1], table.shape[1] * k.shape[1], k.shape[1]
    if a.get("cu_seqlens_q") is not None:
        return "varlen", a["cu_seqlens_q"].shape[0] - 1, a["max_seqlen_q"], a["max_seqlen_k"], 0
    return "seqused", q.shape[0], q.shape[1], k.shape[1], 0
