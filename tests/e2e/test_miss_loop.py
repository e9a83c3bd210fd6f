"""The miss loop closes: a miss carries the Call that rebuilds exactly its kernel, and `build --from-misses`
builds every missed kernel key.

A mixed training/serving workload runs through FA4's autograd functions on fake tensors, in a process configured
for h200 as a GPU client would be. Serving calls go through flash_attn_func / flash_attn_varlen_func. Training
calls do what torch.autograd.Function.apply does (forward with grad disabled and inputs that require grad, then
backward with the same ctx): real autograd cannot build a graph over fake CUDA tensors in a CPU-only torch.
Each kernel FA4 looks up is paired with calls.current(), the Call a miss would carry; re-planning that Call
must select it.
Before the fix, calls inside a training step were recorded as pass "fwd" (autograd runs Function.forward with
grad disabled), so a rebuild compiled inference kernels and missed the training ones.
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain.skus import Sku
from tests.conftest import TINY_VARIANTS, run_cli

H200 = Sku("h200", "sm_90a", 132, 62914560, 13)


def workload(torch: Any, small: bool = False) -> None:
    """Training (dense and varlen, deterministic, GQA, sink) and serving (prefill, decode, paged, split-KV)
    steps as a model would run them. `small`: one training and one serving step (for real compiles)."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    from fa4_aot.fa4.dispatch import _Ctx

    def t(*shape: int, grad: bool = False, dtype: Any = torch.bfloat16) -> Any:
        return torch.empty(*shape, dtype=dtype, device="cuda").requires_grad_(grad)

    def train(fn: Any, q: Any, k: Any, v: Any, **kw: Any) -> None:
        cls = FlashAttnFunc if fn is flash_attn_func else FlashAttnVarlenFunc
        ctx = _Ctx()
        with torch.no_grad():  # as Function.apply runs forward
            out = cls.forward(ctx, q, k, v, **kw)
        out = out[0] if isinstance(out, tuple) else out
        cls.backward(ctx, torch.empty_like(out), None)

    i32 = torch.int32
    train(flash_attn_func, t(2, 256, 4, 64, grad=True), t(2, 256, 4, 64, grad=True), t(2, 256, 4, 64, grad=True),
          causal=True)
    with torch.no_grad():  # serving: prefill then decode
        flash_attn_func(t(1, 128, 4, 64), t(1, 128, 4, 64), t(1, 128, 4, 64))
    if small:
        return
    train(flash_attn_func, t(4, 1000, 32, 128, grad=True), t(4, 1000, 8, 128, grad=True),
          t(4, 1000, 8, 128, grad=True), causal=True, deterministic=True)
    train(flash_attn_varlen_func, t(3000, 40, 128, grad=True), t(3000, 8, 128, grad=True),
          t(3000, 8, 128, grad=True), cu_seqlens_q=t(4, dtype=i32), cu_seqlens_k=t(4, dtype=i32), max_seqlen_q=1500,
          max_seqlen_k=1500, causal=True)
    train(flash_attn_func, t(1, 512, 16, 64, grad=True), t(1, 512, 2, 64, grad=True), t(1, 512, 2, 64, grad=True),
          window_size=(128, 0), learnable_sink=t(16, grad=True))
    with torch.no_grad():
        flash_attn_func(t(8, 1, 32, 128), t(8, 4096, 8, 128), t(8, 4096, 8, 128), causal=True, num_splits=0)
        flash_attn_varlen_func(t(4, 1, 32, 128), t(64, 256, 8, 128), t(64, 256, 8, 128), causal=True,
                               page_table=t(4, 16, dtype=i32), seqused_k=t(4, dtype=i32), num_splits=0)
        flash_attn_func(t(2, 700, 32, 128), t(2, 700, 8, 128), t(2, 700, 8, 128), causal=True, return_lse=True)


def lossy_workload(torch: Any) -> None:
    """Calls a Call summarises lossily (re-planning it selects other kernels): LSE that takes a gradient, a
    float32 sink, q/k/v as strided views of one packed tensor, unequal varlen lengths, a paged decode whose
    max_seqlen_k is not pages x page size."""
    from flash_attn.cute import flash_attn_varlen_func
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    from fa4_aot.fa4.dispatch import _Ctx

    def t(*shape: int, grad: bool = False, dtype: Any = torch.bfloat16) -> Any:
        return torch.empty(*shape, dtype=dtype, device="cuda").requires_grad_(grad)

    def train(cls: Any, *args: Any, dlse: bool = False, **kw: Any) -> None:
        ctx = _Ctx()
        with torch.no_grad():
            out, lse = cls.forward(ctx, *args, **kw)
        cls.backward(ctx, torch.empty_like(out), torch.empty_like(lse) if dlse else None)

    i32 = torch.int32
    train(FlashAttnFunc, *(t(2, 512, 8, 128, grad=True) for _ in range(3)), causal=True, return_lse=True, dlse=True)
    train(FlashAttnFunc, *(t(1, 640, 8, 64, grad=True) for _ in range(3)), softcap=30.0,
          learnable_sink=t(8, grad=True, dtype=torch.float32))
    qkv = t(2, 777, 3, 16, 64)
    train(FlashAttnFunc, *(qkv.as_strided((2, 777, 16, 64), (777 * 3072, 3072, 64, 1), i * 1024).detach()
                           .requires_grad_(True) for i in range(3)), causal=True)
    train(FlashAttnVarlenFunc, t(900, 8, 64, grad=True), t(2100, 8, 64, grad=True), t(2100, 8, 64, grad=True),
          cu_seqlens_q=t(3, dtype=i32), cu_seqlens_k=t(3, dtype=i32), max_seqlen_q=600, max_seqlen_k=2000,
          deterministic=True)
    with torch.no_grad():
        flash_attn_varlen_func(t(16, 1, 32, 128), t(2048, 16, 8, 128), t(2048, 16, 8, 128),
                               page_table=t(16, 128, dtype=i32), seqused_k=t(16, dtype=i32), max_seqlen_k=1500,
                               causal=True)


def _init() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    from fa4_aot import fa4

    fa4.configure(H200)


def record_lookups(lossy: bool = False) -> list[dict[str, Any]]:
    """Run the workload (and with `lossy`, lossy_workload) with caches that record each kernel FA4 looks up and
    the Call and exact record (fa4_aot.domain.exact) a miss would carry."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4_aot import fa4
    from fa4_aot.domain.kernel_keys import canonical, dumps
    from fa4_aot.fa4 import caches

    seen: list[dict[str, Any]] = []

    class Lookup(caches.Recorder):
        def __contains__(self, key: Any) -> bool:
            call = fa4.current()
            seen.append({"family": self.family, "ident": dumps(canonical(key)),
                         "call": call.to_dict() if call else None, "args": fa4.current_record()})
            return True

    fa4.capture()
    with FakeTensorMode(), caches.swapped(lambda family, _old: Lookup(family, {})):
        workload(torch)
        if lossy:
            lossy_workload(torch)
    return seen


def replan(lookups: list[dict[str, Any]]) -> list[str]:
    """The lookups whose recorded Call does not select their kernel when planned again."""
    from fa4_aot import fa4
    from fa4_aot.domain.calls import Call

    bad = []
    for item in lookups:
        if item["call"] is None:
            bad.append(f"{item['family']}: no call recorded")
            continue
        call = Call.from_dict(item["call"])
        if (item["family"], item["ident"]) not in fa4.plan(call):
            bad.append(f"{item['family']} {item['ident'][:120]} not selected by {call.describe()}")
    return bad


def replay(lookups: list[dict[str, Any]]) -> list[str]:
    """The lookups whose exact record does not ask for their kernel when replayed."""
    from fa4_aot import fa4
    from fa4_aot.domain.exact import ExactCall

    bad = []
    for item in lookups:
        if item["args"] is None:
            bad.append(f"{item['family']}: no exact record")
        elif (item["family"], item["ident"]) not in fa4.plan(ExactCall.from_dict(item["args"])):
            bad.append(f"{item['family']} {item['ident'][:120]} not asked for by {item['args']}")
    return bad


def _lookups_and_replay() -> tuple[int, list[str]]:
    lookups = record_lookups(lossy=True)
    return len(lookups), replay(lookups)


def test_exact_records_replay_to_every_kernel_looked_up() -> None:
    """Every kernel FA4 looks up, in the workload and in calls whose Call is lossy, is asked for again when the
    exact record a miss would carry is replayed (what `build --from-misses` compiles from)."""
    looked_up, bad = _in_h200_process(_lookups_and_replay)
    assert looked_up > 30 and not bad, "\n".join(bad)


def _in_h200_process(fn: Any, *args: Any) -> Any:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init) as pool:
        return pool.submit(fn, *args).result()


def _lookups_and_replan() -> tuple[list[dict[str, Any]], list[str]]:
    lookups = record_lookups()
    return lookups, replan(lookups)


def test_miss_inside_training_call_records_bwd_pass() -> None:
    lookups, bad = _in_h200_process(_lookups_and_replan)
    families = {item["family"] for item in lookups}
    assert {"_flash_attn_fwd", "_flash_attn_bwd", "_bwd_preprocess", "_flash_attn_fwd_combine"} <= families
    backward = [item for item in lookups if item["family"] == "_flash_attn_bwd"]
    assert backward and all(item["call"]["pass_"] in ("bwd", "bwd_det") for item in backward)
    assert not bad, "\n".join(bad)


def fallback_run(store_root: str) -> list[str]:
    """The small workload through store-backed caches in fallback mode against `store_root` (FA4 compiles each
    missing kernel for real, on fake tensors); the kernel keys recorded as misses."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4_aot import fa4
    from fa4_aot.client.installation import Installation
    from fa4_aot.fa4 import caches
    from fa4_aot.store import Store
    from fa4_aot.trust.policy import Trust

    store = Store(Path(store_root))
    inst = Installation(sku=H200, store=store, mode="fallback", trace=[], trust=Trust(H200, store, None, {}),
                        tools=fa4.toolchain())
    fa4.capture()
    with FakeTensorMode(), caches.swapped(lambda family, _old: fa4.store_cache(family, inst)):
        workload(torch, small=True)
    return list(inst.stats.misses)


@pytest.mark.slow
def test_build_from_misses_builds_every_missed_kernel(tmp_path: Path) -> None:
    from fa4_aot.store import Store

    missed = _in_h200_process(fallback_run, str(tmp_path))
    store = Store(tmp_path)
    recorded = store.misses()
    assert set(missed) == {m.kernel_key for m in recorded} and len(missed) >= 5
    assert {m.call["pass_"] for m in recorded if m.family == "_flash_attn_bwd" and m.call} == {"bwd"}
    result = run_cli("build", "--from-misses", "--variants", str(TINY_VARIANTS), "--json", cache=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    [report] = json.loads(result.stdout)
    assert report["failed"] == 0
    left = [k for k in missed if not store.has_entry(k)]
    assert not left, f"missed kernels not built: {left}; misses: {[asdict(m) for m in recorded]}"
