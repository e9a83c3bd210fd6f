"""FA4's call arguments as the lean runtime's recipes read them: the Signature of a call's flags, the form of a
flash_attn_varlen_func call (varlen, seqused or paged) and its recipe sizes, and the refusal, by name, of arguments
no recipe records.

Only the planning path (a call's first time, or a training call) comes here: a repeated forward-only call goes
from api.py's plan cache straight to FA4's allocation and launch. Reads shapes and Python values, never a
tensor's contents (so a CUDA graph replay equals a fresh call).
"""

from __future__ import annotations

from typing import Any

from ..domain.signature import Signature
from ..errors import Unsupported

# FA4 arguments no recipe records: taken at their default (None, False, 0, ()), else refused by name for FA4 itself
_UNSUPPORTED = ("qv", "gather_kv_indices", "score_mod", "score_mod_bwd", "mask_mod", "aux_tensors", "aux_scalars",
                "block_sparse_tensors", "block_sparse_tensors_bwd", "pack_gqa", "seqused_q", "min_seqlen_k",
                "scheduler_metadata", "seqlen_k_per_split", "disable_scheduler_metadata", "gather_bwd_recompute_p",
                "gather_bwd_token_chunk")
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
# the names a caller may write for those dtypes instead of the torch object (load(..., dtype="bf16"))
_DTYPE_NAMES = {"bf16": "torch.bfloat16", "bfloat16": "torch.bfloat16", "fp16": "torch.float16",
                "float16": "torch.float16", "half": "torch.float16"}
_FORMS = {("cu_seqlens_q", "cu_seqlens_k"): "varlen", ("seqused_k",): "seqused", ("seqused_k", "page_table"): "paged"}


def refuse(extra: dict[str, Any]) -> None:
    """Raise for FA4 keyword arguments beyond the lean entry points' own that are given a value (not None, False, 0
    or ()): TypeError naming those FA4 does not take either, else errors.Unsupported naming them (no recipe records
    them). Returns when every one is at its default."""
    given = [k for k, v in extra.items() if v not in (None, False, 0, ())]
    unknown = [k for k in given if k not in _UNSUPPORTED]
    if unknown:
        raise TypeError(f"unexpected argument(s) {', '.join(unknown)}")
    if given:
        raise Unsupported(f"the lean runtime has no recipe for {', '.join(given)}; call FA4 itself after "
                          "fa4_aot.install() for these")


def dtype_name(dtype: Any) -> str:
    """The torch name ("torch.bfloat16") of `dtype`: a torch dtype, or one of the strings "bf16", "bfloat16",
    "fp16", "float16", "half" (or "torch.bfloat16"). Raises ValueError naming what is accepted for anything else."""
    name = str(dtype)
    name = _DTYPE_NAMES.get(name.lower().removeprefix("torch."), name) if isinstance(dtype, str) else name
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported: FA4 kernels here are bf16 or fp16; pass torch.bfloat16 "
                         "or torch.float16 (or the strings 'bf16', 'fp16')")
    return name


def signature(layout: str, dtype: str, heads_q: int, head_dim: int, heads_kv: int, head_dim_v: int, *,
              causal: bool = False, window_size: Any = (None, None), softcap: float = 0.0, sink: bool = False,
              num_splits: int = 1, training: bool = False, deterministic: bool = False,
              return_lse: bool = False, page_size: int = 0) -> Signature:
    """The Signature (as the planner records it) of a call with these arguments. Raises ValueError for
    arguments FA4 takes but no recipe can describe (a half-open window, a dtype other than bf16/fp16)."""
    dtype = dtype_name(dtype)
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
    (None, 0) is causal; any other window is local, so a causal call with a window is a local one
    (reading it as causal would drop the window). Raises ValueError for a half-open local window."""
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


def varlen_form(tensors: dict[str, Any], max_seqlen_q: Any, max_seqlen_k: Any) -> tuple[str, dict[str, int]]:
    """The layout and recipe sizes of a flash_attn_varlen_func call, from the named tensors it was given (q, k, v
    and those of cu_seqlens_q/k, seqused_k and page_table that are not None) and its max lengths: varlen needs
    integer max lengths (the sizes FA4's dispatch reads); for seqused and paged a max length left out is FA4's
    default. Raises errors.Unsupported for any other form or for a tensor max length."""
    layout = _varlen_layout(tensors["q"], tensors.get("cu_seqlens_q"), tensors.get("cu_seqlens_k"),
                           tensors.get("seqused_k"), tensors.get("page_table"))
    if layout != "varlen":
        return layout, decode_sizes(layout, tensors["q"], tensors["k"], tensors.get("page_table"), max_seqlen_q,
                                    max_seqlen_k)
    if not isinstance(max_seqlen_q, int) or not isinstance(max_seqlen_k, int):
        raise Unsupported("the lean varlen path needs integer max_seqlen_q/k (the sizes FA4's dispatch reads); "
                          "call FA4 after fa4_aot.install() for tensor or missing max lengths")
    return layout, {"batch": tensors["cu_seqlens_q"].shape[0] - 1, "total_q": tensors["q"].shape[0],
                    "total_k": tensors["k"].shape[0], "max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k}


def _varlen_layout(q: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, seqused_k: Any, page_table: Any) -> str:
    """Which recorded layout a flash_attn_varlen_func call has; errors.Unsupported for other combinations."""
    if cu_seqlens_q is None and cu_seqlens_k is None and seqused_k is not None and q.dim() == 4:
        return "seqused" if page_table is None else "paged"
    if cu_seqlens_q is not None and cu_seqlens_k is not None and seqused_k is None and page_table is None:
        return "varlen"
    given = tuple(name for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                                       ("seqused_k", seqused_k), ("page_table", page_table)) if t is not None)
    layout = _FORMS.get(given)
    if layout is None or (layout != "varlen" and q.dim() != 4):
        raise Unsupported(
            f"the lean runtime has recipes for varlen (cu_seqlens_q and cu_seqlens_k), seqused (4-d q, k, v with "
            f"seqused_k) and paged (4-d q, page_table and seqused_k) calls, not for {' + '.join(given) or 'none'} "
            f"with a {q.dim()}-d q; call FA4 after fa4_aot.install() for this one")
    return layout


def decode_sizes(layout: str, q: Any, k: Any, page_table: Any, max_seqlen_q: int | None,
                 max_seqlen_k: int | None) -> dict[str, int]:
    """The recipe sizes of a seqused or paged call; a max length left out is FA4's default for it."""
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None and not isinstance(value, int):
            raise Unsupported(f"{name} must be an int or None on the lean runtime (FA4 reads it on the "
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
