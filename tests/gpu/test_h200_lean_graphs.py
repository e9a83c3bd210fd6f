"""Lean decode in CUDA graphs (issue 17, point 4), as vLLM and SGLang capture decode attention: one eager call
at the captured sizes (warm-up), torch.cuda.graph around one call, then rounds of new contents written in place
into q, k, v, seqused_k and page_table, each replayed; every replay's out (and lse) must equal, bitwise, a fresh
uncaptured lean call on the same tensors. Seqused and paged KV at page sizes 1, 16 and 64, with and without LSE,
max_seqlen_k given or FA4's default; and a fresh process whose very first lean call is inside the capture.

The module fixture builds the few kernels it needs into the store (FA4_AOT_CACHE) with `fa4-aot build --calls`
(FA4 and its compiler stack installed, as for tests/gpu/test_h200_lean.py; kernels present are not rebuilt).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

B, SK, HQ, HKV, D = 4, 1024, 32, 8, 128
ROUNDS = 4
CASES = [  # name, layout, page_size, flags
    ("seqused", "seqused", 0, {}),
    ("seqused-lse", "seqused", 0, {"return_lse": True}),
    ("paged1", "paged", 1, {}),
    ("paged16", "paged", 16, {}),
    ("paged16-lse", "paged", 16, {"return_lse": True}),
    ("paged64-max-seqlen", "paged", 64, {"max_seqlen_q": 1, "max_seqlen_k": SK}),
]


def _call(layout: str, page_size: int, lse: bool, batch: int = B) -> dict:
    return {"layout": layout, "pass_": "fwd_lse" if lse else "fwd", "dtype": "bf16", "head_dim": D, "head_dim_v": D,
            "mask": "causal", "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": batch,
            "seqlen_q": 1, "seqlen_k": SK, "heads_q": HQ, "heads_kv": HKV, "page_size": page_size}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    calls = [_call(layout, ps, bool(flags.get("return_lse"))) for _n, layout, ps, flags in CASES]
    path = tmp_path_factory.mktemp("graphs") / "calls.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    done = subprocess.run([sys.executable, "-m", "fa4_aot", "build", "--sku", "h200", "--calls", str(path), "-j", "8",
                           "-q"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _static(layout: str, page_size: int, gen):
    """The captured tensors: q, k, v (a dense cache, or a page pool half again as large as the batch needs) and
    the extra arguments (seqused_k; page_table)."""
    import torch

    q = torch.empty(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    extra = {"seqused_k": torch.empty(B, device="cuda", dtype=torch.int32)}
    if layout == "paged":
        pages = SK // page_size
        k, v = (torch.empty(B * pages * 3 // 2, page_size, HKV, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        extra["page_table"] = torch.empty(B, pages, device="cuda", dtype=torch.int32)
    else:
        k, v = (torch.empty(B, SK, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    _refill(q, k, v, extra, gen, 0)
    return q, k, v, extra


def _refill(q, k, v, extra, gen, round_: int) -> None:
    """New contents, in place: random q, k, v; lengths from 1 to the capacity (round 0: 1 and full among them);
    a new random page order."""
    import torch

    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, device="cuda", generator=gen).to(t.dtype))
    lengths = torch.randint(1, SK + 1, (B,), device="cuda", generator=gen, dtype=torch.int32)
    if round_ == 0:
        lengths[:2] = torch.tensor([1, SK], device="cuda", dtype=torch.int32)
    extra["seqused_k"].copy_(lengths)
    if "page_table" in extra:
        table = extra["page_table"]
        order = torch.randperm(k.shape[0], device="cuda", generator=gen)[:table.numel()]
        table.copy_(order.view(table.shape).to(torch.int32))


@pytest.mark.parametrize("name,layout,page_size,flags", CASES, ids=[c[0] for c in CASES])
def test_replay_with_new_contents_equals_an_uncaptured_call(built, name, layout, page_size, flags):
    import torch

    import fa4_aot

    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v, extra = _static(layout, page_size, gen)
    call = {**extra, "causal": True, **flags}
    fa4_aot.flash_attn_varlen_func(q, k, v, **call)  # warm-up at the captured sizes
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fa4_aot.flash_attn_varlen_func(q, k, v, **call)
    assert (lse is not None) == bool(flags.get("return_lse"))
    seen = []
    for round_ in range(ROUNDS):
        _refill(q, k, v, extra, gen, round_)
        graph.replay()
        fresh_out, fresh_lse = fa4_aot.flash_attn_varlen_func(q, k, v, **call)
        torch.cuda.synchronize()
        assert torch.equal(out, fresh_out), f"{name}: round {round_}: replayed out differs from an uncaptured call"
        if lse is not None:
            assert torch.equal(lse, fresh_lse), f"{name}: round {round_}: replayed lse differs"
        seen.append(out.clone())
    assert not any(torch.equal(seen[0], later) for later in seen[1:]), "new contents did not change the output"


COLD = r"""
import json, sys, torch, fa4_aot
layout, page_size = sys.argv[1], int(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(6)
b, sk, hq, hkv, d = json.loads(sys.argv[3])
q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
extra = {"seqused_k": torch.full((b,), sk // 3, device="cuda", dtype=torch.int32)}
if layout == "paged":
    pages = sk // page_size
    k, v = (torch.randn(b * pages, page_size, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
    extra["page_table"] = torch.randperm(b * pages, device="cuda", generator=g).view(b, pages).to(torch.int32)
else:
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):  # the process's first lean call: recipe read, kernels loaded, plan bound, captured
    out, _ = fa4_aot.flash_attn_varlen_func(q, k, v, causal=True, **extra)
extra["seqused_k"].copy_(torch.randint(1, sk + 1, (b,), device="cuda", generator=g, dtype=torch.int32))
graph.replay()
fresh, _ = fa4_aot.flash_attn_varlen_func(q, k, v, causal=True, **extra)
torch.cuda.synchronize()
print(json.dumps(torch.equal(out, fresh)))
"""


@pytest.mark.parametrize("layout,page_size", [("seqused", 0), ("paged", 16)], ids=["seqused", "paged16"])
def test_first_call_of_a_process_can_be_captured(built, layout, page_size):
    """No warm-up at all: a fresh process's first lean call happens inside the capture (its recipe file read,
    its kernel libraries loaded, its plan bound: host work only, none of it recorded into the graph), and the
    graph replays it with new seqused_k contents bitwise as an uncaptured call computes it."""
    done = subprocess.run([sys.executable, "-c", COLD, layout, str(page_size), json.dumps([B, SK, HQ, HKV, D])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) is True
