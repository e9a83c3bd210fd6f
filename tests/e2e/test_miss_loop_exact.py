"""The miss loop closes for calls a Call cannot summarise (issue 8, point 4): a fallback run of a mixed
training/serving workload, then `fa4-aot build --from-misses`, then the same workload in strict mode: 0 misses.

Regression: `--from-misses` re-planned the lossy Call a miss carried (batch and max lengths, no strides, no
seqused_k against the page table...), and on the H200 rebuilt 20 of the 25 kernels tests/gpu/test_h200_miss_loop.py
missed. The client now records the exact FA4 arguments of the call in flight, and the build replays them.

Everything runs on this CPU host as a GPU client would, through fa4_aot.install() with FA4_AOT_SKU=h200 (FA4 plans
for the H200 on fake CUDA tensors, which predicts the kernels the GPU asks for), each phase in a fresh interpreter.
Training steps drive FlashAttn[Varlen]Func.forward then .backward as autograd does: a CPU-only torch cannot build
an autograd graph over fake CUDA tensors. The one liberty: in the fallback phase a missing kernel is recorded by
the client's real miss path (Installation.object_for) and then not compiled, where real fallback lets FA4 compile
it; that compile is the cost `build --from-misses` pays below, and it changes nothing the miss records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow

CLIENT = r'''
import json, sys
import fa4_aot

inst = fa4_aot.install(sys.argv[1])  # FA4_AOT_SKU=h200: FA4 plans for the H200 on this CPU host

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc
from fa4_aot.fa4 import caches

def noop(*a, **k):
    pass

class Probe(caches.StoreCache):
    """Asks the installation exactly as install()'s caches do (a miss is recorded, or KernelMissing raised in
    strict mode), then lets FA4 go on without compiling or loading: fake tensors launch nothing."""
    def __contains__(self, key):
        if key not in self.cache:
            self.source.object_for(self.family, key)
            self.cache[key] = noop
        return True

class Ctx:
    saved_tensors = ()
    def save_for_backward(self, *t):
        self.saved_tensors = t
    def set_materialize_grads(self, value):
        pass

bf16, i32 = torch.bfloat16, torch.int32

def t(*shape, grad=False, dtype=bf16):
    return torch.empty(*shape, dtype=dtype, device="cuda").requires_grad_(grad)

def lens(*n):
    """cu_seqlens of sequences of lengths n: FA4's host code reads only its shape (values stay on the device)."""
    return t(len(n) + 1, dtype=i32)

def packed(qkv, i):
    """qkv[:, :, i] requiring grad, made with as_strided: a fake CUDA tensor's slice cannot require grad here."""
    b, s, _, h, d = qkv.shape
    return qkv.as_strided((b, s, h, d), (s * 3 * h * d, 3 * h * d, d, 1), i * h * d).detach().requires_grad_(True)

def train(fn, *args, dlse=False, **kw):
    """A training step as torch.autograd.Function.apply runs it: forward with grad disabled, then backward."""
    ctx = Ctx()
    with torch.no_grad():
        out, lse = fn.forward(ctx, *args, **kw)
        fn.backward(ctx, torch.empty_like(out), torch.empty_like(lse) if dlse else None)

def workload():
    # the GPU test's workload (tests/gpu/test_h200_miss_loop.py), one to one
    train(FlashAttnFunc, t(2, 1000, 32, 128, grad=True), t(2, 1000, 8, 128, grad=True),
          t(2, 1000, 8, 128, grad=True), causal=True)
    train(FlashAttnFunc, t(4, 333, 16, 64, grad=True), t(4, 333, 16, 64, grad=True), t(4, 333, 16, 64, grad=True),
          causal=False, deterministic=True)
    train(FlashAttnFunc, t(1, 2048, 28, 128, grad=True), t(1, 2048, 4, 128, grad=True),
          t(1, 2048, 4, 128, grad=True), window_size=(512, 0))
    train(FlashAttnVarlenFunc, *(t(3 * 700, h, 128, grad=True) for h in (40, 8, 8)), cu_seqlens_q=lens(700, 700, 700),
          cu_seqlens_k=lens(700, 700, 700), max_seqlen_q=700, max_seqlen_k=700, causal=True)
    with torch.no_grad():
        flash_attn_func(t(1, 4000, 32, 128), t(1, 4000, 8, 128), t(1, 4000, 8, 128), causal=True)
        flash_attn_func(t(8, 1, 32, 128), t(8, 3000, 8, 128), t(8, 3000, 8, 128), causal=True)
        flash_attn_varlen_func(t(4, 1, 32, 128), t(128, 128, 8, 128), t(128, 128, 8, 128),
                               page_table=t(4, 32, dtype=i32), seqused_k=t(4, dtype=i32), causal=True)
        flash_attn_func(t(2, 300, 16, 64), t(2, 100, 16, 64), t(2, 100, 16, 64), causal=True)
    # more: unequal varlen lengths in fwd+bwd, a paged decode whose max_seqlen_k is not pages x page size,
    # seqused_k without paging, LSE that takes a gradient, q/k/v as views of one packed tensor (strides), a float32
    # sink with softcap, MQA decode against a long cache (no split-KV: FA4 asserts it is not supported on sm_90),
    # varlen queries over a paged cache
    train(FlashAttnVarlenFunc, *(t(1300, h, 128, grad=True) for h in (12, 2, 2)), cu_seqlens_q=lens(1000, 200, 100),
          cu_seqlens_k=lens(1000, 200, 100), max_seqlen_q=1000, max_seqlen_k=1000, causal=True)
    train(FlashAttnVarlenFunc, t(900, 8, 64, grad=True), t(2100, 8, 64, grad=True), t(2100, 8, 64, grad=True),
          cu_seqlens_q=lens(300, 600), cu_seqlens_k=lens(100, 2000), max_seqlen_q=600, max_seqlen_k=2000,
          deterministic=True)
    train(FlashAttnFunc, t(2, 512, 8, 128, grad=True), t(2, 512, 8, 128, grad=True), t(2, 512, 8, 128, grad=True),
          causal=True, return_lse=True, dlse=True)
    train(FlashAttnFunc, *(packed(t(2, 777, 3, 16, 64), i) for i in range(3)), causal=True)
    train(FlashAttnFunc, t(1, 640, 8, 64, grad=True), t(1, 640, 8, 64, grad=True), t(1, 640, 8, 64, grad=True),
          softcap=30.0, learnable_sink=t(8, grad=True, dtype=torch.float32))
    with torch.no_grad():
        flash_attn_varlen_func(t(16, 1, 32, 128), t(2048, 16, 8, 128), t(2048, 16, 8, 128),
                               page_table=t(16, 128, dtype=i32), seqused_k=t(16, dtype=i32), max_seqlen_k=1500,
                               causal=True)
        flash_attn_varlen_func(t(3, 64, 16, 128), t(3, 5000, 4, 128), t(3, 5000, 4, 128),
                               seqused_k=t(3, dtype=i32), causal=True)
        flash_attn_func(t(1, 1, 64, 128), t(1, 70000, 8, 128), t(1, 70000, 8, 128))
        flash_attn_func(t(2, 256, 16, 128), t(2, 256, 16, 128), t(2, 256, 16, 128), return_lse=True)
        # vLLM's call: packed (varlen) queries of a mixed prefill/decode batch over a paged cache, which no Call
        # layout describes (a Call's paged layout has one query length per sequence)
        flash_attn_varlen_func(t(37, 32, 128), t(64, 16, 8, 128), t(64, 16, 8, 128), cu_seqlens_q=lens(1, 1, 35),
                               max_seqlen_q=35, seqused_k=t(3, dtype=i32), page_table=t(3, 20, dtype=i32),
                               max_seqlen_k=320, causal=True)

with FakeTensorMode(), caches.swapped(lambda family, _old: Probe(family, inst)):
    workload()
print(json.dumps({"misses": inst.stats.misses}))
'''


def client(mode: str, cache: Path) -> list[str]:
    """Run the workload as a client in `mode` against `cache`; the kernel keys it missed (strict: raises)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    env.update(FA4_AOT_CACHE=str(cache), FA4_AOT_SKU="h200", TORCH_CPP_LOG_LEVEL="ERROR")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CLIENT, mode], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["misses"]


def test_miss_loop_rebuilds_exact_kernels(tmp_path: Path) -> None:
    from fa4_aot.store import Store

    missed = client("fallback", tmp_path)
    recorded = Store(tmp_path).misses()
    assert len(set(missed)) >= 25 and {m.kernel_key for m in recorded} == set(missed)
    result = run_cli("build", "--from-misses", "--json", "-j", "2", cache=tmp_path, timeout=3600)
    report = json.loads(result.stdout)[0] if result.stdout.strip().startswith("[") else {}
    not_rebuilt = [f"{f['family']} ({f['call']}): {f['error']}" for f in report.get("failures", [])]
    assert result.returncode == 0 and not not_rebuilt, (
        f"{len(not_rebuilt)} of {len(set(missed))} missed kernels not rebuilt:\n" + "\n".join(not_rebuilt)
        if not_rebuilt else result.stderr[-3000:])
    assert client("strict", tmp_path) == []
