"""FA4's entry points on the lean runtime: `flash_attn_func`, `flash_attn_varlen_func` and `load()`.

Same arguments and results as flash_attn.cute's functions for what the planner records: dense; varlen
(cu_seqlens_q/k); seqused (dense q/k/v with seqused_k); paged KV decode (dense q, page_table and seqused_k);
causal, local, softcap, learnable sink, GQA, deterministic backward, return_lse, split-KV (num_splits > 1, or 0
for FA4's heuristic). Anything else raises fa4_aot.Unsupported naming the argument, and runs with FA4 itself
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
from typing import TYPE_CHECKING, Any

from ..domain import recipe_format
from ..errors import Unsupported
from . import replay, runner
from .call_args import dtype_name, refuse, signature, varlen_form

if TYPE_CHECKING:  # torch is imported on first call, not by `import fa4_aot`
    from torch import Tensor

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


def _attention(layout: str, q: Any, k: Any, v: Any, causal: bool, window_size: Any, softcap: float,
               learnable_sink: Any, num_splits: int, deterministic: bool, return_lse: bool) -> runner.Attention:
    """The Attention of this call's signature (cached per flags; paged: the page size is k's dimension 1)."""
    needs_grad = q.requires_grad or k.requires_grad or v.requires_grad or (
        learnable_sink is not None and learnable_sink.requires_grad)
    training = needs_grad and _torch().is_grad_enabled()
    if training and return_lse:
        raise Unsupported("return_lse=True with a backward pass: FA4 then back-propagates through lse, which "
                               "no recipe records; call FA4 after fa4_aot.install() for this")
    # FA4 computes LSE (with another kernel than without) whenever an input requires grad, in no_grad too, and
    # returns it: without grad such a call is a forward returning LSE, as FA4 runs it
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


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int | None, int | None] = (None, None), learnable_sink: Tensor | None = None,
                    softcap: float = 0.0, num_splits: int = 1, deterministic: bool = False, return_lse: bool = False,
                    **extra: Any) -> tuple[Tensor, Tensor | None]:
    """flash_attn.cute.flash_attn_func on the lean runtime: returns (out, lse); lse is None unless the call
    trains or return_lse."""
    if extra:
        refuse(extra)
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
    return _remember(key, attn, sizes, tensors, learnable_sink, softmax_scale)


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
              learnable_sink: Any, scale: float | None) -> tuple[Any, Any]:
    """Run the call through the planning path (runner.run, on its own copy of `tensors`, with the sink if any);
    with a `key` (a forward-only call without grad), keep its bound plan for the next call with that key."""
    tensors = dict(tensors) if learnable_sink is None else {**tensors, "learnable_sink": learnable_sink}
    result = runner.run(attn, sizes, tensors, scale)
    if key is not None:
        bound = attn.bound(sizes, tensors["q"].device, scale)
        try:
            if not bound.trains:
                _plans[key] = bound
        except TypeError:
            pass
    return result


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor | None = None,
                           cu_seqlens_k: Tensor | None = None, max_seqlen_q: int | None = None,
                           max_seqlen_k: int | None = None, seqused_k: Tensor | None = None,
                           page_table: Tensor | None = None, softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int | None, int | None] = (None, None),
                           learnable_sink: Tensor | None = None, softcap: float = 0.0, num_splits: int = 1,
                           deterministic: bool = False, return_lse: bool = False,
                           **extra: Any) -> tuple[Tensor, Tensor | None]:
    """flash_attn.cute.flash_attn_varlen_func on the lean runtime, for three forms of call: varlen (cu_seqlens_q/k
    and integer max_seqlen_q/k, the sizes FA4's dispatch reads), seqused (q, k, v as (batch, seqlen, heads, dim)
    with seqused_k) and paged (q as (batch, seqlen_q, heads, dim), k and v as (num_pages, page_size, heads, dim)
    pools, page_table and seqused_k); max_seqlen_q/k are optional for the last two, as in FA4."""
    if extra:
        refuse(extra)
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
                page_table is None or page_table.stride(-1) == 1) and (found := _planned(key, tensors)) is not None:
            return found
    layout, sizes = varlen_form(tensors, max_seqlen_q, max_seqlen_k)
    attn = _attention(layout, q, k, v, causal, window_size, softcap, learnable_sink, num_splits, deterministic,
                      return_lse)
    return _remember(key, attn, sizes, tensors, learnable_sink, softmax_scale)


def _shape(t: Any) -> Any:
    return None if t is None else t.shape


class Loaded:
    """A signature loaded up front by load(): calling it runs flash_attn_func / flash_attn_varlen_func."""

    def __init__(self, layout: str, flags: dict[str, Any], attention: runner.Attention) -> None:
        self.layout, self.flags, self.attention = layout, flags, attention

    def __repr__(self) -> str:
        s, rt = self.attention.sig, self.attention.rt
        mask = f"{s.mask} window={list(s.window)}" if s.mask == "local" else s.mask
        extra = "".join([f", softcap={s.softcap:g}" if s.softcap else "", ", sink" if s.sink else "",
                         f", num_splits={s.num_splits}" if s.num_splits != 1 else "",
                         f", page_size={s.page_size}" if s.page_size else ""])
        return (f"<fa4_aot.Loaded {s.layout} {s.pass_} {s.dtype} heads={s.heads_q}/{s.heads_kv} "
                f"head_dim={s.head_dim}/{s.head_dim_v} {mask}{extra} on SKU {rt.sku.name}: "
                f"{len(self.attention.regions)} recipe region(s) from {rt.store.root}>")

    def __call__(self, q: Any, k: Any, v: Any, **kwargs: Any) -> tuple[Any, Any]:
        fn = flash_attn_func if self.layout == "dense" else flash_attn_varlen_func
        return fn(q, k, v, **{**self.flags, **kwargs})


def load(q_shape: tuple[int, int, int, int], k_shape: tuple[int, int, int, int] | None = None, *,
         causal: bool = False, dtype: Any = None, window_size: Any = (None, None), softcap: float = 0.0,
         learnable_sink: bool = False, num_splits: int = 1, layout: str = "dense", page_size: int = 0,
         training: bool = False, deterministic: bool = False, return_lse: bool = False,
         cache_dir: Path | None = None, family: str = "fa4") -> Any:
    """Load the recipe and every kernel of this signature at these sizes (q_shape = (batch, seqlen_q, heads,
    head_dim), k_shape likewise; for varlen, batch and the max lengths; for paged, seqlen_k is what the page
    table spans, with `page_size`), then return a callable with FA4's semantics (a `Loaded`). Raises
    KernelMissing before returning when the store lacks a recipe region or kernel. family="tirx": the TIRx FA4
    kernel of exactly these static shapes (fp16, head dim 128, dense; fa4_aot/tirx/loading.py), a callable
    attn(q, k, v) -> out, admitted as the lean runtime's kernels are (Runtime.admit: TrustError for a kernel no
    valid signed manifest lists under FA4_AOT_TRUSTED_KEYS, KernelRefused when certification refuses it)."""
    if family == "tirx":
        from ..tirx.loading import load as load_tirx

        rt = runner.runtime(cache_dir)
        return load_tirx(q_shape, k_shape, causal=causal, store=rt.store, sku=rt.sku, constants=rt.constants,
                         admit=rt.admit)
    if family != "fa4":
        raise ValueError(f"unknown kernel family {family!r}; fa4_aot.load takes family='fa4' or 'tirx'")
    import torch

    if layout == "paged" and page_size <= 0:
        raise ValueError("layout='paged' needs page_size (k's dimension 1 in the call: the pool's page size)")
    k_shape = k_shape or q_shape
    sig = signature(layout, dtype_name(dtype or torch.bfloat16), q_shape[2], q_shape[3], k_shape[2], k_shape[3],
                    causal=causal, window_size=window_size, softcap=softcap, sink=learnable_sink,
                    num_splits=num_splits, training=training, deterministic=deterministic, return_lse=return_lse,
                    page_size=page_size)
    attn = runner.runtime(cache_dir).attention(sig)
    attn.preload(recipe_format.sizes_of_call(layout, q_shape[0], q_shape[1], k_shape[1], page_size))
    flags = {"causal": causal, "window_size": window_size, "softcap": softcap, "num_splits": num_splits,
             "deterministic": deterministic, "return_lse": return_lse}
    return Loaded(layout, flags, attn)

