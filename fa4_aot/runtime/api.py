"""FA4's entry points on the lean runtime: `flash_attn_func`, `flash_attn_varlen_func` and `load()`.

Same arguments and results as flash_attn.cute's functions for what the planner records: dense; varlen
(cu_seqlens_q/k); seqused (dense q/k/v with seqused_k); paged KV decode (dense q, page_table and seqused_k);
causal, local, softcap, learnable sink, GQA, deterministic backward, return_lse, split-KV (num_splits > 1, or 0
for FA4's heuristic). Anything else raises runner.Unsupported naming the argument, and runs with FA4 itself
through fa4_aot.install().

Per-call host work: a forward-only call none of whose inputs requires grad (inference, decode) is planned once per
shapes, dtype, device, flags, max lengths and scale (_plans); a repeated call checks its tensors (shape, dtype,
device, a unit last stride) and runs FA4's allocation and launch, with no autograd node. Training calls go through
the autograd Function.

CUDA graphs (decode as vLLM and SGLang capture it): such a call can be captured with torch.cuda.graph, also as
the process's first call, and replayed after new contents are written in place into its tensors (q, k, v,
seqused_k, page_table): the host reads only shapes and Python scalars, never a tensor's contents, so a replay equals
a fresh call on the same tensors, bitwise (tests/gpu/test_h200_lean_graphs.py). What the host decided is fixed at
capture, as with FA4 and vLLM: every shape (batch, the KV cache or page pool, pages per sequence), max_seqlen_q/k
(FA4's dispatch reads them: the pack-GQA choice, the split count of num_splits=0), the flags, softmax_scale and the
output tensors (a replay rewrites the captured out and lse). seqused_k values must stay within the cache (seqlen_k,
or pages_per_seq x page_size), as FA4 requires of any call: the kernels read them on the device, unchecked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..spec.signature import Signature
from . import replay, runner

_UNSUPPORTED = ("qv", "gather_kv_indices", "score_mod", "score_mod_bwd", "mask_mod", "aux_tensors", "aux_scalars",
                "block_sparse_tensors", "block_sparse_tensors_bwd", "pack_gqa", "seqused_q", "min_seqlen_k",
                "scheduler_metadata", "seqlen_k_per_split")
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
# Forward-only calls none of whose inputs requires grad (inference, decode): the bound plan by all that planning reads
# (shapes, dtype, device, flags, max lengths, scale), so that a repeated call goes from its arguments straight to
# FA4's allocation and launch
_plans: dict[tuple[Any, ...], replay.Bound] = {}


class _Attentions(dict):  # type: ignore[type-arg]
    """Attention per call flags; clearing it (another runtime) drops the plans bound from them too."""

    def clear(self) -> None:
        super().clear()
        _plans.clear()


_cache: dict[tuple[Any, ...], runner.Attention] = _Attentions()


def _torch() -> Any:
    """torch, imported on first use (importing fa4_aot does not import it)."""
    if not _modules:
        import torch

        _modules.append(torch)
    return _modules[0]


_modules: list[Any] = []


def _refuse(extra: dict[str, Any]) -> None:
    given = [k for k, v in extra.items() if v not in (None, False, 0, ())]
    unknown = [k for k in given if k not in _UNSUPPORTED and k not in ("disable_scheduler_metadata",
                                                                          "gather_bwd_recompute_p",
                                                                          "gather_bwd_token_chunk")]
    if unknown:
        raise TypeError(f"unexpected argument(s) {', '.join(unknown)}")
    if given:
        raise runner.Unsupported(f"the lean runtime has no recipe for {', '.join(given)}; call FA4 itself after "
                               "fa4_aot.install() for these")


def _attention(layout: str, q: Any, k: Any, v: Any, causal: bool, window_size: Any, softcap: float,
               learnable_sink: Any, num_splits: int, deterministic: bool, return_lse: bool) -> runner.Attention:
    """The Attention of this call's signature (cached per flags; paged: the page size is k's dimension 1)."""
    needs_grad = q.requires_grad or k.requires_grad or v.requires_grad or (
        learnable_sink is not None and learnable_sink.requires_grad)
    training = needs_grad and _torch().is_grad_enabled()
    if training and return_lse:
        raise runner.Unsupported("return_lse=True with a backward pass: FA4 then back-propagates through lse, which "
                               "no recipe records; call FA4 after fa4_aot.install() for this")
    # FA4 computes LSE (with another kernel than without) whenever an input requires grad, in no_grad too, and
    # returns it: without grad such a call is a forward returning LSE, as FA4 runs it (issue 17)
    return_lse = bool(return_lse) or bool(needs_grad)
    window = tuple(window_size) if window_size is not None else (None, None)
    page_size = k.shape[1] if layout == "paged" else 0
    cache_key = (layout, page_size, q.dtype, q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1], bool(causal), window,
                 float(softcap or 0.0), learnable_sink is None, num_splits, bool(deterministic), bool(return_lse),
                 training)
    found = _cache.get(cache_key)
    if found is None:
        sig = signature(layout, str(q.dtype), q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1], causal=causal,
                        window_size=window, softcap=softcap, sink=learnable_sink is not None,
                        num_splits=num_splits, training=training, deterministic=deterministic,
                        return_lse=return_lse, page_size=page_size)
        found = _cache[cache_key] = runner.runtime().attention(sig)
    return found


def signature(layout: str, dtype: str, heads_q: int, head_dim: int, heads_kv: int, head_dim_v: int, *,
              causal: bool = False, window_size: Any = (None, None), softcap: float = 0.0, sink: bool = False,
              num_splits: int = 1, training: bool = False, deterministic: bool = False,
              return_lse: bool = False, page_size: int = 0) -> Signature:
    """The Signature (as the planner records it) of a call with these arguments. Raises ValueError for
    arguments FA4 takes but no recipe can describe (a half-open window, a dtype other than bf16/fp16)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype} is not supported: FA4 kernels here are bf16 or fp16")
    mask, window = _mask_and_window(bool(causal), tuple(window_size))
    return Signature(
        layout=layout,
        pass_=("bwd_det" if deterministic else "bwd") if training else ("fwd_lse" if return_lse else "fwd"),
        dtype=_DTYPES[dtype], head_dim=head_dim, head_dim_v=head_dim_v, mask=mask, window=window,
        softcap=float(softcap or 0.0), sink=sink, num_splits=num_splits, heads_q=heads_q, heads_kv=heads_kv,
        page_size=page_size if layout == "paged" else 0)


def _mask_and_window(causal: bool, window_size: tuple[Any, Any]) -> tuple[str, tuple[int, int]]:
    """The mask and window FA4 runs for `causal` and `window_size`, read as its interface reads them
    (_resolve_causal_local_window): two negative sides are no window, causal sets the right side to 0, and
    (None, 0) is causal; any other window is local, so a causal call with a window is a local one (issue 17:
    reading it as causal dropped the window). Raises ValueError for a half-open local window."""
    left, right = window_size
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None
    if causal:
        right = 0
    if left is None and right in (None, 0):
        return ("full" if right is None else "causal"), (0, 0)
    if left is None or right is None:
        raise ValueError(f"window_size={window_size}: give both sides as integers for a local window")
    return "local", (int(left), int(right))


def flash_attn_func(q: Any, k: Any, v: Any, softmax_scale: float | None = None, causal: bool = False,
                    window_size: Any = (None, None), learnable_sink: Any = None, softcap: float = 0.0,
                    num_splits: int = 1, deterministic: bool = False, return_lse: bool = False,
                    **extra: Any) -> tuple[Any, Any]:
    """flash_attn.cute.flash_attn_func on the lean runtime: returns (out, lse); lse is None unless the call
    trains or return_lse."""
    if extra:
        _refuse(extra)
    tensors = {"q": q, "k": k, "v": v}
    key = None
    if learnable_sink is None and not (q.requires_grad or k.requires_grad or v.requires_grad):
        key = ("dense", q.shape, k.shape, v.shape, q.dtype, q.device, causal, window_size, softcap, num_splits,
               deterministic, return_lse, softmax_scale)
        if q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1:
            found = _planned(key, tensors)
            if found is not None:
                return found
    attn = _attention("dense", q, k, v, causal, window_size, softcap, learnable_sink, num_splits, deterministic,
                      return_lse)
    sizes = {"batch": q.shape[0], "seqlen_q": q.shape[1], "seqlen_k": k.shape[1]}
    if learnable_sink is not None:
        tensors["learnable_sink"] = learnable_sink
    return _remember(key, attn, sizes, dict(tensors), softmax_scale)


def _planned(key: tuple[Any, ...], tensors: dict[str, Any]) -> tuple[Any, Any] | None:
    """(out, lse) of a forward-only call through the plan bound for `key` by an earlier call; None when there is
    none. The caller checked that q, k, v and page_table have a unit last stride (else the planning path copies
    them, as FA4 does)."""
    try:
        bound = _plans.get(key)
    except TypeError:  # an unhashable argument (a window_size list): the planning path each time
        return None
    if bound is None:
        return None
    bound.check(tensors)
    return bound.forward(tensors)


def _remember(key: tuple[Any, ...] | None, attn: runner.Attention, sizes: dict[str, int], tensors: dict[str, Any],
              scale: float | None) -> tuple[Any, Any]:
    """Run the call through the planning path (runner.run); with a `key` (a forward-only call without grad), keep
    its bound plan for the next call with that key."""
    result = runner.run(attn, sizes, tensors, scale)
    if key is not None:
        bound = attn.bound(sizes, tensors["q"].device, scale)
        try:
            if not bound.bwd:
                _plans[key] = bound
        except TypeError:
            pass
    return result


def flash_attn_varlen_func(q: Any, k: Any, v: Any, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
                           max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                           seqused_k: Any = None, page_table: Any = None,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: Any = (None, None), learnable_sink: Any = None, softcap: float = 0.0,
                           num_splits: int = 1, deterministic: bool = False, return_lse: bool = False,
                           **extra: Any) -> tuple[Any, Any]:
    """flash_attn.cute.flash_attn_varlen_func on the lean runtime, for three forms of call: varlen
    (cu_seqlens_q/k and integer max_seqlen_q/k, the sizes FA4's dispatch reads), seqused (q, k, v as
    (batch, seqlen, heads, dim) with seqused_k) and paged (q as (batch, seqlen_q, heads, dim), k and v as
    (num_pages, page_size, heads, dim) pools, page_table and seqused_k); max_seqlen_q/k are optional for the
    last two, as in FA4."""
    if extra:
        _refuse(extra)
    tensors = {"q": q, "k": k, "v": v}
    if cu_seqlens_q is not None:
        tensors["cu_seqlens_q"] = cu_seqlens_q
    if cu_seqlens_k is not None:
        tensors["cu_seqlens_k"] = cu_seqlens_k
    if page_table is not None:
        tensors["page_table"] = page_table
    if seqused_k is not None:
        tensors["seqused_k"] = seqused_k
    key = None
    if learnable_sink is None and not (q.requires_grad or k.requires_grad or v.requires_grad):
        key = ("varlen", q.shape, k.shape, v.shape, _shape(cu_seqlens_q), _shape(cu_seqlens_k), _shape(page_table),
               _shape(seqused_k), q.dtype, q.device, max_seqlen_q, max_seqlen_k, causal, window_size, softcap,
               num_splits, deterministic, return_lse, softmax_scale)
        if q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and (
                page_table is None or page_table.stride(-1) == 1):
            found = _planned(key, tensors)
            if found is not None:
                return found
    layout = _varlen_layout(q, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table)
    if layout == "varlen":
        if not isinstance(max_seqlen_q, int) or not isinstance(max_seqlen_k, int):
            raise runner.Unsupported("the lean varlen path needs integer max_seqlen_q/k (the sizes FA4's dispatch "
                                   "reads); call FA4 after fa4_aot.install() for tensor or missing max lengths")
        sizes = {"batch": cu_seqlens_q.shape[0] - 1, "total_q": q.shape[0], "total_k": k.shape[0],
                 "max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k}
    else:
        sizes = _decode_sizes(layout, q, k, page_table, max_seqlen_q, max_seqlen_k)
    if learnable_sink is not None:
        tensors["learnable_sink"] = learnable_sink
    attn = _attention(layout, q, k, v, causal, window_size, softcap, learnable_sink, num_splits, deterministic,
                      return_lse)
    return _remember(key, attn, sizes, dict(tensors), softmax_scale)


def _shape(t: Any) -> Any:
    return None if t is None else t.shape


def _varlen_layout(q: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, seqused_k: Any, page_table: Any) -> str:
    """Which recorded layout a flash_attn_varlen_func call has; runner.Unsupported for other combinations."""
    if cu_seqlens_q is None and cu_seqlens_k is None and seqused_k is not None and q.dim() == 4:
        return "seqused" if page_table is None else "paged"
    if cu_seqlens_q is not None and cu_seqlens_k is not None and seqused_k is None and page_table is None:
        return "varlen"
    given = tuple(name for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                                       ("seqused_k", seqused_k), ("page_table", page_table)) if t is not None)
    forms = {("cu_seqlens_q", "cu_seqlens_k"): "varlen", ("seqused_k",): "seqused",
             ("seqused_k", "page_table"): "paged"}
    layout = forms.get(given)
    if layout is None or (layout != "varlen" and q.dim() != 4):
        raise runner.Unsupported(
            f"the lean runtime has recipes for varlen (cu_seqlens_q and cu_seqlens_k), seqused (4-d q, k, v with "
            f"seqused_k) and paged (4-d q, page_table and seqused_k) calls, not for {' + '.join(given) or 'none'} "
            f"with a {q.dim()}-d q; call FA4 after fa4_aot.install() for this one")
    return layout


def _decode_sizes(layout: str, q: Any, k: Any, page_table: Any, max_seqlen_q: int | None,
                  max_seqlen_k: int | None) -> dict[str, int]:
    """The recipe sizes of a seqused or paged call; a max length left out is FA4's default for it."""
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None and not isinstance(value, int):
            raise runner.Unsupported(f"{name} must be an int or None on the lean runtime (FA4 reads it on the "
                                   "host); call FA4 after fa4_aot.install() for a tensor")
    batch, seqlen_q = q.shape[0], q.shape[1]
    if layout == "seqused":
        return {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": k.shape[1],
                "max_seqlen_q": seqlen_q if max_seqlen_q is None else max_seqlen_q,
                "max_seqlen_k": k.shape[1] if max_seqlen_k is None else max_seqlen_k}
    pages = page_table.shape[1]
    return {"batch": batch, "seqlen_q": seqlen_q, "num_pages": k.shape[0], "pages_per_seq": pages,
            "max_seqlen_q": seqlen_q if max_seqlen_q is None else max_seqlen_q,
            "max_seqlen_k": pages * k.shape[1] if max_seqlen_k is None else max_seqlen_k}


class Loaded:
    """A signature loaded up front by load(): calling it runs flash_attn_func / flash_attn_varlen_func."""

    def __init__(self, layout: str, flags: dict[str, Any], attention: runner.Attention) -> None:
        self.layout, self.flags, self.attention = layout, flags, attention

    def __call__(self, q: Any, k: Any, v: Any, **kwargs: Any) -> tuple[Any, Any]:
        fn = flash_attn_func if self.layout == "dense" else flash_attn_varlen_func
        return fn(q, k, v, **{**self.flags, **kwargs})


def load(q_shape: tuple[int, int, int, int], k_shape: tuple[int, int, int, int] | None = None, *,
         causal: bool = False, dtype: Any = None, window_size: Any = (None, None), softcap: float = 0.0,
         learnable_sink: bool = False, num_splits: int = 1, layout: str = "dense", page_size: int = 0,
         training: bool = False, deterministic: bool = False, return_lse: bool = False,
         cache_dir: Path | None = None) -> Loaded:
    """Load the recipe and every kernel of this signature at these sizes (q_shape = (batch, seqlen_q, heads,
    head_dim), k_shape likewise; for varlen, batch and the max lengths; for paged, seqlen_k is what the page
    table spans, with `page_size`), then return a callable with FA4's semantics. Raises KernelMissing before
    returning when the store lacks a recipe region or kernel."""
    import torch

    if layout == "paged" and page_size <= 0:
        raise ValueError("layout='paged' needs page_size (k's dimension 1 in the call: the pool's page size)")
    k_shape = k_shape or q_shape
    sig = signature(layout, str(dtype or torch.bfloat16), q_shape[2], q_shape[3], k_shape[2], k_shape[3],
                    causal=causal, window_size=window_size, softcap=softcap, sink=learnable_sink,
                    num_splits=num_splits, training=training, deterministic=deterministic, return_lse=return_lse,
                    page_size=page_size)
    attn = runner.runtime(cache_dir).attention(sig)
    attn.preload(replay.sizes_of_call(layout, q_shape[0], q_shape[1], k_shape[1], page_size))
    flags = {"causal": causal, "window_size": window_size, "softcap": softcap, "num_splits": num_splits,
             "deterministic": deterministic, "return_lse": return_lse}
    return Loaded(layout, flags, attn)

