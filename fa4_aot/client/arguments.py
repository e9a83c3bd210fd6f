"""prepare()'s arguments, checked and turned into a Call. Pure: the torch dtype is matched by name."""

from __future__ import annotations

from typing import Any

from ..domain.calls import Call, dtype_name, mask_of, pass_of


def call_from(q_shape: tuple[int, ...], k_shape: tuple[int, ...] | None, *, causal: bool, dtype: Any,
              window_size: tuple[int | None, int | None], softcap: float, sink: bool, num_splits: int,
              layout: str, page_size: int, training: bool, deterministic: bool, return_lse: bool) -> Call:
    """The Call prepare() plans. Raises ValueError saying which argument is wrong and what it should be."""
    if len(q_shape) != 4 or (k_shape is not None and len(k_shape) != 4):
        raise ValueError("q_shape and k_shape are (batch, seqlen, heads, head_dim) for every layout")
    k_shape = k_shape or q_shape
    name = dtype_name(dtype) if dtype is not None else "bf16"
    if name is None:
        raise ValueError(f"dtype {dtype} is not supported: FA4 kernels here are bf16 or fp16")
    local = window_size != (None, None)
    if local and None in window_size:
        raise ValueError(f"window_size={window_size}: give both sides as integers for a local window")
    if local and causal:
        raise ValueError("pass either causal=True or a window_size, as FA4 treats causal as window (None, 0)")
    if layout == "paged" and page_size <= 0:
        raise ValueError("layout='paged' needs page_size")
    return Call.from_dict({
        "layout": layout, "pass_": pass_of(training=training, deterministic=deterministic, return_lse=return_lse),
        "dtype": name, "head_dim": q_shape[3], "head_dim_v": k_shape[3], "mask": mask_of(causal=causal, local=local),
        "window": window_size if local else (0, 0), "softcap": float(softcap), "sink": sink,
        "num_splits": num_splits, "batch": q_shape[0], "seqlen_q": q_shape[1], "seqlen_k": k_shape[1],
        "heads_q": q_shape[2], "heads_kv": k_shape[2], "page_size": page_size if layout == "paged" else 0,
    })
