"""Running a Call through FA4's own entry points.

`run()` drives FlashAttnFunc / FlashAttnVarlenFunc exactly as autograd would (forward, then backward for
training passes) so that FA4's own dispatch picks tile sizes, q_stage, pack_gqa, split-KV and 2-CTA. Under
FakeTensorMode FA4 launches nothing; with a recording cache in place (see caches.py) a run lists the kernels
the call needs without compiling anything. `attend()` is the real call a loaded AttentionFn makes.
"""

from __future__ import annotations

from typing import Any

from ..domain.calls import Call


class _Ctx:
    """Stands in for autograd's ctx so that FA4's forward and backward can be driven directly."""

    saved_tensors: tuple[Any, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def set_materialize_grads(self, value: bool) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
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


def attend(call: Call, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    """flash_attn_func (dense) or flash_attn_varlen_func with `call`'s flags; `kwargs` add or override them."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    fn = flash_attn_func if call.layout == "dense" else flash_attn_varlen_func
    return fn(q, k, v, **{**call.flags(), **kwargs})


def _arguments(call: Call, torch: Any) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[call.dtype]
    grad = call.training

    def tensor(*shape: int, dt: Any = dtype) -> Any:
        t = _empty_cuda(torch, shape, dt)
        return t.requires_grad_(grad) if dt in (torch.bfloat16, torch.float16) else t

    b, sq, sk, hq, hkv = call.batch, call.seqlen_q, call.seqlen_k, call.heads_q, call.heads_kv
    d, dv = call.head_dim, call.head_dim_v
    kwargs: dict[str, Any] = {**call.flags(), "learnable_sink": tensor(hq) if call.sink else None}
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


def _empty_cuda(torch: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """torch.empty(shape) on 'cuda'. Under FakeTensorMode (planning) the fake tensor is made from a meta tensor:
    the same tensor as the mode's torch.empty makes (shape, stride, dtype, device), at a twentieth of the cost,
    since the mode's dispatch (cache key, output from the cache entry) is skipped; planning a signature makes
    thousands of them (bench/plan_speed.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    with unset_fake_temporarily() as mode:
        if not isinstance(mode, FakeTensorMode):  # a real CUDA context (loading): the real allocation
            return torch.empty(*shape, dtype=dtype, device="cuda")
        meta = torch.empty(*shape, dtype=dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, torch.device("cuda"))
