"""On a GPU: kernels cross-compiled on a CPU host run in strict mode with zero compiles, correctly.

Needs the store (cache/ or FA4_AOT_CACHE) to hold these calls for this GPU's SKU: the default build
(`fa4-aot build --sku h200`), or just the GPU tests' calls (`fa4-aot build --sku h200 --calls
tests/data/gpu_calls.jsonl`, a minute with -j 16). Each case is one representative LLM shape that is
not necessarily a point of the build's shape grids: FA4's dispatch picks the kernels at run time.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (name, load kwargs, q shape, kv shape, layout details)
CASES = [
    ("llama-8b-train-causal-gqa4", dict(causal=True, training=True), (2, 4096, 32, 128), (2, 4096, 8, 128)),
    ("bert-style-full-mha", dict(causal=False, training=True), (8, 512, 16, 64), (8, 512, 16, 64)),
    ("qwen-train-gqa8-d128", dict(causal=True, training=True), (1, 8192, 32, 128), (1, 8192, 4, 128)),
    ("mistral-sliding-window", dict(window_size=(4096, 0), training=True), (1, 8192, 32, 128), (1, 8192, 8, 128)),
    ("gemma-softcap", dict(causal=True, softcap=50.0, training=True), (2, 2048, 16, 128), (2, 2048, 8, 128)),
    ("deterministic-bwd", dict(causal=True, training=True, deterministic=True), (2, 2048, 16, 128), (2, 2048, 16, 128)),
    ("d64-inference", dict(causal=True), (4, 1024, 32, 64), (4, 1024, 32, 64)),
    ("d256-train", dict(causal=True, training=True), (1, 2048, 16, 256), (1, 2048, 16, 256)),
    ("deepseek-192-128", dict(causal=True, training=True), (1, 2048, 16, 192), (1, 2048, 16, 128)),
    ("varlen-train", dict(causal=True, training=True, layout="varlen"), (4, 2048, 32, 128), (4, 2048, 8, 128)),
    ("varlen-prefill-lse", dict(causal=True, return_lse=True, layout="varlen"), (8, 1024, 32, 128), (8, 1024, 8, 128)),
    ("decode-paged-gqa8", dict(causal=True, layout="paged", page_size=128), (16, 1, 32, 128), (16, 8192, 4, 128)),
    ("decode-seqused-long", dict(causal=True, layout="seqused"), (4, 1, 32, 128), (4, 65536, 8, 128)),
]


def _reference(q, k, v, causal, window, softcap):
    import torch

    b, sq, h, d = q.shape
    hkv = k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf = kf.repeat_interleave(h // hkv, dim=1)
    vf = vf.repeat_interleave(h // hkv, dim=1)
    s = qf @ kf.transpose(-1, -2) / d**0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sk = k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    mask = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        mask |= j > i
    if window is not None:
        mask |= (j < i - window[0]) | (j > i + window[1])
    s = s.masked_fill(mask, float("-inf"))
    return (s.softmax(-1) @ vf).transpose(1, 2)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def compile_counter():
    import cutlass.cute as cute

    import fa4_aot

    inst = fa4_aot.install("strict")
    real = cute.compile
    count = {"n": 0}

    def counting(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    cute.compile = counting
    yield count, inst
    cute.compile = real


@pytest.mark.parametrize("name,kw,qs,ks", CASES, ids=[c[0] for c in CASES])
def test_strict_zero_compiles_and_correct(compile_counter, name, kw, qs, ks):
    import torch

    import fa4_aot

    count, inst = compile_counter
    before = count["n"]
    attn = fa4_aot.client.prepare(qs, ks, **kw)  # through FA4 (install path); fa4_aot.load is the lean runtime
    torch.manual_seed(0)
    b, sq, h, d = qs
    _, sk, hkv, dv = ks
    dev = "cuda"
    q = torch.randn(qs, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(b, sk, hkv, dv, device=dev, dtype=torch.bfloat16)
    causal = kw.get("causal", False)
    window = kw.get("window_size")
    softcap = kw.get("softcap", 0.0)
    layout = kw.get("layout", "dense")
    training = kw.get("training", False)
    ref = _reference(q, k, v, causal, window, softcap)
    if layout == "dense":
        if training:
            q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        out = attn(q, k, v)
    elif layout == "varlen":
        cu_q = torch.arange(0, (b + 1) * sq, sq, device=dev, dtype=torch.int32)
        cu_k = torch.arange(0, (b + 1) * sk, sk, device=dev, dtype=torch.int32)
        qv, kv_, vv = (t.reshape(-1, *t.shape[2:]).detach().clone() for t in (q, k, v))
        if training:
            qv.requires_grad_(), kv_.requires_grad_(), vv.requires_grad_()
        out = attn(qv, kv_, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=sq, max_seqlen_k=sk)
        out_t = out[0] if isinstance(out, tuple) else out
        out = (out_t.reshape(b, sq, h, dv), *out[1:]) if isinstance(out, tuple) else out_t.reshape(b, sq, h, dv)
    elif layout == "seqused":
        used = torch.full((b,), sk, device=dev, dtype=torch.int32)
        out = attn(q, k, v, seqused_k=used)
    else:  # paged: identity page table over a pool holding each sequence's pages in order
        ps = kw["page_size"]
        pages = sk // ps
        k_cache = k.reshape(b * pages, ps, hkv, d)
        v_cache = v.reshape(b * pages, ps, hkv, dv)
        table = torch.arange(b * pages, device=dev, dtype=torch.int32).reshape(b, pages)
        used = torch.full((b,), sk, device=dev, dtype=torch.int32)
        out = attn(q, k_cache, v_cache, page_table=table, seqused_k=used)
    o = out[0] if isinstance(out, tuple) else out
    assert _rel(o, ref) < 1e-2, f"{name}: relative error {_rel(o, ref):.3e} vs float32 reference"
    if training:
        o.float().square().sum().backward()
    torch.cuda.synchronize()
    assert count["n"] == before, f"{name}: {count['n'] - before} JIT compile(s) in strict mode"
    assert inst.stats.compiled == 0


def test_aot_output_equals_jit_output(compile_counter):
    """Same call, same inputs: the kernels loaded from the store and fresh JIT compiles agree bit for bit
    (deterministic backward, so that dQ accumulation order is fixed in both)."""
    import torch
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.cache_utils import JITCache

    from fa4_aot.fa4 import caches

    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2048, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out_aot = flash_attn_func(q, k, v, causal=True, deterministic=True)[0]
    grads_aot = torch.autograd.grad(out_aot.float().sum(), (q, k, v))
    with caches.swapped(lambda family, old: JITCache()):
        out_jit = flash_attn_func(q, k, v, causal=True, deterministic=True)[0]
        grads_jit = torch.autograd.grad(out_jit.float().sum(), (q, k, v))
    assert torch.equal(out_aot, out_jit)
    for a, j in zip(grads_aot, grads_jit, strict=True):
        assert torch.equal(a, j)


def test_fallback_mode_compiles_a_missing_kernel_and_records_the_miss(tmp_path):
    """In a fresh process with an empty store, fallback mode lets FA4 compile, records each miss with the call
    that needed it, and `fa4-aot misses` lists them."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    child = r"""
import json, torch, fa4_aot
from flash_attn.cute import flash_attn_func
inst = fa4_aot.install("fallback")
q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out, _ = flash_attn_func(q, k, v, causal=True)
torch.cuda.synchronize()
stats = {"compiled": inst.stats.compiled, "misses": len(inst.stats.misses)}
print(json.dumps({**stats, "finite": bool(out.isfinite().all())}))
"""
    env = {**os.environ, "FA4_AOT_CACHE": str(tmp_path / "empty")}
    env.pop("FA4_AOT_SERVER", None)
    out = subprocess.run([sys.executable, "-c", child], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["compiled"] >= 1 and stats["misses"] == stats["compiled"] and stats["finite"]
    listed = subprocess.run([sys.executable, "-m", "fa4_aot", "misses", "--json"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    misses = json.loads(listed.stdout)
    assert len(misses) == stats["misses"]
    assert all(m["sku"] == "h200" and m["call"] and m["call"]["head_dim"] == 64 for m in misses)
