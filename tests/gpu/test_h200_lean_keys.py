"""On the H200 (issue 29, part 1): the lean runtime serves a call wherever FA4 over install() serves it with the same
build, at page sizes and window sizes the build never named, and its outputs equal FA4's bitwise there.

Measured from outside before the fix: paged decode at page size 1 (ten public models) and a training call at window
(1023, 0) ran under FA4 over install() with kernels built for other page sizes and windows, and the lean runtime
raised KernelMissing ("no recorded recipe of Signature(layout='paged', ..., page_size=1)"). FA4's compile key holds
neither value; where its host code branches on one (a page of exactly its tile, 128 tokens, takes the TMA path: other
kernels), both runtimes must miss alike.

Needs the store of tests/data/lean_keys_variants.toml in FA4_AOT_CACHE (paged decode built at page size 16, a local
window built at (256, 0); see that file):
python -m pytest -q -p no:cacheprovider tests/gpu/test_h200_lean_keys.py
"""

from __future__ import annotations

import pytest

from tests.gpu.test_h200_lean import FA4_RUNS, _assert_same, _run

pytestmark = pytest.mark.gpu

DB, DSK, DH, DHKV = 4, 2048, 32, 8  # decode: one query token against a KV cache of 2048 (the build's sizes)
USED = (2048, 1000, 1, 1537)
PAGE_SIZES = [1, 2, 16, 64, 128, 256]  # built: 16
WINDOWS = [(128, 0), (511, 0), (1023, 0), (100, 100), (0, 0), (256, 0)]  # built: (256, 0) at 1024 tokens


@pytest.fixture(scope="module")
def fa4():
    import fa4_aot

    fa4_aot.install("strict")
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    return {"dense": flash_attn_func, "paged": flash_attn_varlen_func}


def _paged(fn, page_size: int, return_lse: bool):
    """A paged decode call: a shared pool a tenth larger than the batch needs, its pages in random order."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(page_size)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    pages = DSK // page_size
    pool = DB * pages + max(1, DB * pages // 10)
    q = randn(DB, 1, DH, 128)
    k, v = (randn(pool, page_size, DHKV, 128) for _ in range(2))
    table = torch.randperm(pool, device="cuda", generator=g)[:DB * pages].view(DB, pages).to(torch.int32)
    used = torch.tensor(USED, device="cuda", dtype=torch.int32)
    out, lse = fn(q, k, v, page_table=table, seqused_k=used, causal=True, return_lse=return_lse)
    torch.cuda.synchronize()
    return {"out": out.clone()} | ({} if lse is None else {"lse": lse.clone()})


def _outcome(run):
    """('served', result) or ('missing', the error's first line): a strict miss on either side is a verdict."""
    from fa4_aot.errors import KernelMissing

    try:
        return "served", run()
    except KernelMissing as e:
        return "missing", str(e).splitlines()[0]


def _alike(name, fa4_runs, lean_run):
    fa4_verdict, first = _outcome(fa4_runs)
    lean_verdict, mine = _outcome(lean_run)
    assert lean_verdict == fa4_verdict, f"{name}: FA4 over install() {fa4_verdict}, lean {lean_verdict}: " + (
        mine if lean_verdict == "missing" else first)
    if fa4_verdict == "served":
        _assert_same(name, mine, first[0], first[1:])
    return fa4_verdict


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("return_lse", [False, True], ids=["fwd", "fwd-lse"])
def test_paged_decode_at_any_page_size_served_like_fa4(fa4, page_size, return_lse):
    import fa4_aot

    verdict = _alike(f"paged{page_size}",
                     lambda: [_paged(fa4["paged"], page_size, return_lse) for _ in range(FA4_RUNS)],
                     lambda: _paged(fa4_aot.flash_attn_varlen_func, page_size, return_lse))
    if page_size != 128:  # 128 = FA4's tile: its TMA path, other kernels than the page-16 build's
        assert verdict == "served", f"page size {page_size}: FA4 itself did not run it over this build"


@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{a}-{b}" for a, b in WINDOWS])
@pytest.mark.parametrize("training", [False, True], ids=["fwd", "bwd"])
def test_local_window_not_built_served_like_fa4(fa4, window, training):
    import fa4_aot

    flags = {"window_size": window}
    verdict = _alike(f"window{window}",
                     lambda: [_run(fa4["dense"], "dense", 8, training, flags) for _ in range(FA4_RUNS)],
                     lambda: _run(fa4_aot.flash_attn_func, "dense", 8, training, flags))
    print(f"window {window} {'bwd' if training else 'fwd'}: {verdict}")
