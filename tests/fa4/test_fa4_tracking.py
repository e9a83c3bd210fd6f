"""The two producers of a Call from flags agree: what load() plans from its arguments (arguments.call_from) is
the Call the seam's tracking describes when FA4 runs with the same arguments (capture.from_arguments), so a
miss reported at run time names the call `fa4-aot build --from-misses` rebuilds. CPU tensors: shapes only."""

from __future__ import annotations

from typing import Any

import pytest

from fa4_aot.client.arguments import call_from
from fa4_aot.fa4.tracking import current, from_arguments, running

CASES = [
    dict(),
    dict(causal=True, training=True),
    dict(causal=True, training=True, deterministic=True),
    dict(window_size=(128, 0), return_lse=True, softcap=15.0),
    dict(sink=True, num_splits=3, fp16=True),
    dict(layout="varlen", causal=True),
    dict(layout="seqused"),
    dict(layout="paged", page_size=64),
]


def _fa4_arguments(torch: Any, case: dict, b: int, sq: int, sk: int, hq: int, hkv: int, d: int) -> tuple[str, dict]:
    dtype = torch.float16 if case.get("fp16") else torch.bfloat16
    layout, grad = case.get("layout", "dense"), bool(case.get("training"))

    def t(*shape: int, dt: Any = dtype) -> Any:
        x = torch.empty(*shape, dtype=dt)
        return x.requires_grad_(grad) if dt is dtype else x

    a: dict[str, Any] = {"causal": case.get("causal", False), "window_size": case.get("window_size", (None, None)),
                         "softcap": case.get("softcap", 0.0), "num_splits": case.get("num_splits", 1),
                         "learnable_sink": t(hq) if case.get("sink") else None,
                         "deterministic": case.get("deterministic", False), "return_lse": case.get("return_lse", False)}
    i32 = torch.int32
    if layout == "varlen":
        a.update(q=t(b * sq, hq, d), k=t(b * sk, hkv, d), v=t(b * sk, hkv, d), cu_seqlens_q=t(b + 1, dt=i32),
                 cu_seqlens_k=t(b + 1, dt=i32), max_seqlen_q=sq, max_seqlen_k=sk)
    elif layout == "paged":
        ps = case["page_size"]
        a.update(q=t(b, sq, hq, d), k=t(b * sk // ps, ps, hkv, d), v=t(b * sk // ps, ps, hkv, d),
                 page_table=t(b, sk // ps, dt=i32), seqused_k=t(b, dt=i32))
    else:
        a.update(q=t(b, sq, hq, d), k=t(b, sk, hkv, d), v=t(b, sk, hkv, d))
        if layout == "seqused":
            a["seqused_k"] = t(b, dt=i32)
    return ("dense" if layout == "dense" else "varlen"), a


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_load_and_capture_describe_the_same_call(case: dict) -> None:
    import torch

    b, sq, sk, hq, hkv, d = 2, 256, 512, 8, 2, 64
    planned = call_from(
        (b, sq, hq, d), (b, sk, hkv, d), causal=case.get("causal", False),
        dtype=torch.float16 if case.get("fp16") else None, window_size=case.get("window_size", (None, None)),
        softcap=case.get("softcap", 0.0), sink=case.get("sink", False), num_splits=case.get("num_splits", 1),
        layout=case.get("layout", "dense"), page_size=case.get("page_size", 0), training=case.get("training", False),
        deterministic=case.get("deterministic", False), return_lse=case.get("return_lse", False))
    entry, arguments = _fa4_arguments(torch, case, b, sq, sk, hq, hkv, d)
    with torch.enable_grad():
        assert from_arguments(entry, arguments) == planned


def test_calls_it_cannot_describe_are_none_and_running_nests() -> None:
    import torch

    _, arguments = _fa4_arguments(torch, {}, 1, 8, 8, 2, 2, 64)
    assert from_arguments("dense", {**arguments, "score_mod": object()}) is None
    assert from_arguments("dense", {**arguments, "window_size": (4, None)}) is None
    call = from_arguments("dense", arguments)
    assert current() is None
    with running(call):
        assert current() == call
        with running(None):
            assert current() is None
        assert current() == call
    assert current() is None
