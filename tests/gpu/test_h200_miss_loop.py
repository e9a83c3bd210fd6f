"""On a GPU: the miss loop closes. A mixed training/serving workload runs in fallback mode against an empty
store (FA4 compiles what is missing, fa4_aot records each miss with its Call and the exact FA4 arguments of the
call, fa4_aot/domain/exact.py), `fa4-aot build --from-misses` replays those records, and the same workload then runs in
strict mode with zero misses and zero compiles. tests/e2e/test_miss_loop_exact.py is the same loop on a
CPU host (FA4_AOT_SKU=h200, fake tensors).

Each phase runs in a fresh process (install() is per process). Takes a few minutes: the build compiles every
kernel of the workload on this machine's CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.store import Store
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.gpu

WORKLOAD = r'''
import json, sys, torch
import cutlass.cute as cute
import fa4_aot
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

inst = fa4_aot.install(sys.argv[1])
compiles = {"n": 0}
real = cute.compile
def counting(*a, **k):
    compiles["n"] += 1
    return real(*a, **k)
cute.compile = counting

def t(*shape, grad=False):
    return torch.randn(*shape, dtype=torch.bfloat16, device="cuda").requires_grad_(grad)

def lens(b, n):
    return torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device="cuda")

# training steps: real autograd
for q, k, v, kw in [
    (t(2, 1000, 32, 128, grad=True), t(2, 1000, 8, 128, grad=True), t(2, 1000, 8, 128, grad=True), dict(causal=True)),
    (t(4, 333, 16, 64, grad=True), t(4, 333, 16, 64, grad=True), t(4, 333, 16, 64, grad=True),
     dict(causal=False, deterministic=True)),
    (t(1, 2048, 28, 128, grad=True), t(1, 2048, 4, 128, grad=True), t(1, 2048, 4, 128, grad=True),
     dict(window_size=(512, 0))),
]:
    out = flash_attn_func(q, k, v, **kw)
    (out[0] if isinstance(out, tuple) else out).float().sum().backward()
# LSE in the loss (the backward takes dLSE), a float32 sink, q/k/v as views of one packed tensor: a Call loses these
out, lse = flash_attn_func(t(2, 512, 8, 128, grad=True), t(2, 512, 8, 128, grad=True), t(2, 512, 8, 128, grad=True),
                           causal=True, return_lse=True)
(out.float().sum() + lse.sum()).backward()
sink = torch.zeros(8, dtype=torch.float32, device="cuda", requires_grad=True)
out = flash_attn_func(t(1, 640, 8, 64, grad=True), t(1, 640, 8, 64, grad=True), t(1, 640, 8, 64, grad=True),
                      softcap=30.0, learnable_sink=sink)
(out[0] if isinstance(out, tuple) else out).float().sum().backward()
qkv = t(2, 777, 3, 16, 64, grad=True)
out = flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
(out[0] if isinstance(out, tuple) else out).float().sum().backward()
q, k, v = (t(3 * 700, h, 128, grad=True) for h in (40, 8, 8))
out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=lens(3, 700), cu_seqlens_k=lens(3, 700), max_seqlen_q=700,
                             max_seqlen_k=700, causal=True)
(out[0] if isinstance(out, tuple) else out).float().sum().backward()
# serving: prefill, contiguous decode, paged decode with the split heuristic, seqlen_k < seqlen_q
with torch.no_grad():
    flash_attn_func(t(1, 4000, 32, 128), t(1, 4000, 8, 128), t(1, 4000, 8, 128), causal=True)
    flash_attn_func(t(8, 1, 32, 128), t(8, 3000, 8, 128), t(8, 3000, 8, 128), causal=True)
    pages = torch.arange(4 * 32, dtype=torch.int32, device="cuda").reshape(4, 32)
    flash_attn_varlen_func(t(4, 1, 32, 128), t(128, 128, 8, 128), t(128, 128, 8, 128), page_table=pages,
                           seqused_k=torch.full((4,), 4000, dtype=torch.int32, device="cuda"), causal=True)
    flash_attn_func(t(2, 300, 16, 64), t(2, 100, 16, 64), t(2, 100, 16, 64), causal=True)
torch.cuda.synchronize()
print(json.dumps({"misses": inst.stats.misses, "compiles": compiles["n"], "loaded": inst.stats.loaded}))
'''


def _run(mode: str, cache: Path) -> dict:
    env = {**os.environ, "FA4_AOT_CACHE": str(cache)}
    env.pop("FA4_AOT_SERVER", None)
    out = subprocess.run([sys.executable, "-c", WORKLOAD, mode], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fallback_then_build_from_misses_then_strict_has_no_misses(tmp_path: Path) -> None:
    fallback = _run("fallback", tmp_path)
    assert fallback["misses"] and fallback["compiles"] >= len(set(fallback["misses"]))
    result = run_cli("build", "--from-misses", "--json", "-j", "4", cache=tmp_path, timeout=3600)
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    [report] = json.loads(result.stdout)
    # a miss names a kernel's base key; the report names a kernel that consumed SKU constants by its full key
    # (the base entry is its signpost), so the store is asked
    not_rebuilt = [k for k in set(fallback["misses"]) if not Store(tmp_path).has_entry(k)]
    assert report["failed"] == 0 and not not_rebuilt, (report["failures"], not_rebuilt)
    strict = _run("strict", tmp_path)
    assert strict["misses"] == [] and strict["compiles"] == 0 and strict["loaded"] >= len(set(fallback["misses"]))
