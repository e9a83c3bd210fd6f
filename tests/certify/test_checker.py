"""The checker's judging (fa4_aot/certify/checker.py) on the CPU, with the real inputs and fp32 reference and
stand-in kernels: torch's own attention in the input precision (right), and the same with one defect each (a wrong
output, a wrong dq, a deterministic backward that does not repeat, a lean runtime that differs from FA4, a kernel
that raises). FA4's kernels themselves run only on a GPU: tests/gpu/test_h200_certify.py."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fa4_aot.certify import blame, checker, reproduce
from fa4_aot.certify.checker import Runtimes, run
from fa4_aot.certify.plan import Check, Use
from fa4_aot.certify.pool import Outcome
from fa4_aot.domain.signature import Signature
from fa4_aot.errors import KernelMissing

FWD = Signature("dense", "fwd", "bf16", 64, 64, "causal", (0, 0), 0.0, False, 1, 4, 4)
BWD = dataclasses.replace(FWD, pass_="bwd")
DET = dataclasses.replace(FWD, pass_="bwd_det")
POINT = {"batch": 2, "seqlen_q": 48, "seqlen_k": 48, "heads_kv": 4}


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad * ctx.scale, None


def kernel(out_scale: float = 1.0, dq_scale: float = 1.0, noisy_grads: bool = False) -> Callable[..., Any]:
    """Attention as torch computes it in the input precision (FA4's semantics for causal at equal lengths)."""
    calls: list[None] = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, **_: Any) -> Any:
        if dq_scale != 1.0:
            q = _ScaleGrad.apply(q, dq_scale)
        if noisy_grads:  # each run's dq scaled differently, by more than bf16 resolves (a random scale near 1
            calls.append(None)  # could round to the same bits twice: the test failed once so)
            q = _ScaleGrad.apply(q, 1.0 + len(calls) * 2**-4)
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                             v.transpose(1, 2), is_causal=causal)
        return o.transpose(1, 2) * out_scale, None

    return attend


def judged(sig: Signature, fa4: Callable[..., Any], lean: Callable[..., Any] | None = None) -> dict[str, Any]:
    check = Check(sig, POINT, (Use("_flash_attn_fwd", "a" * 64),), "typical", 3)
    parts: list[str] = []
    runtimes = Runtimes(lambda _sig: fa4, (lambda _sig: lean) if lean else None, device="cpu")
    answer = run("c1", check, runtimes, lambda doc: parts.append(doc["part"]))
    answer["parts"] = parts
    return answer


@pytest.mark.parametrize("sig", [FWD, BWD, DET], ids=lambda s: s.pass_)
def test_a_right_kernel_passes(sig: Signature) -> None:
    answer = judged(sig, kernel(), lean=kernel())
    assert answer["status"] == "pass", answer
    assert answer["parts"][:2] == (["fwd", "bwd"] if sig.pass_ != "fwd" else ["fwd", "fwd"])


def test_an_answer_says_where_the_check_spent_its_time() -> None:
    answer = judged(BWD, kernel(), lean=kernel())
    steps = answer["steps"]
    assert {"inputs", "fa4", "reference", "compare", "lean", "cpu"} <= set(steps), steps
    assert all(seconds >= 0 for seconds in steps.values())
    assert steps["reference"] > 0  # the fp32 and low-precision references of a training call: real work


def test_the_oracle_reproduces_a_failure_that_comes_only_now_and_then() -> None:
    # the default h200 build's certification: FA4's 128/64 backward without a mask failed 1 to 3 of the store's 5
    # runs of a check; FA4's JIT, run once, passed three of them, and they were called fa4-aot's own defects
    calls: list[None] = []
    right = kernel()

    def now_and_then(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        out, lse = right(*args, **kwargs)
        return (out * 1.05 if len(calls) == 3 else out), lse

    check = Check(FWD, POINT, (Use("_flash_attn_fwd", "a" * 64),), "typical", 3)
    runtimes = Runtimes(lambda _sig: now_and_then, None, device="cpu")
    answer = checker.oracle_run("c1", check, runtimes, lambda _doc: None, runs=5)
    assert answer["status"] == "wrong" and answer["runs"] == 3, answer
    assert {f["tensor"] for f in answer["failures"]} == {"out"}
    steady = checker.oracle_run("c2", check, Runtimes(lambda _sig: kernel(), None, device="cpu"), lambda _d: None,
                                runs=3)
    assert steady["status"] == "pass" and steady["runs"] == 3


def test_a_wrong_output_fails_out() -> None:
    answer = judged(FWD, kernel(out_scale=1.05))
    assert answer["status"] == "wrong" and {f["tensor"] for f in answer["failures"]} == {"out"}


def test_a_wrong_dq_fails_dq_alone() -> None:
    answer = judged(BWD, kernel(dq_scale=2.3))  # FA4's sm_90 bug at head dims 72/80: relative error 1.3
    assert answer["status"] == "wrong" and {f["tensor"] for f in answer["failures"]} == {"dq"}, answer
    (failure,) = answer["failures"]
    assert failure["error"] > failure["bound"] > 0


def test_a_deterministic_backward_must_repeat_bitwise() -> None:
    answer = judged(DET, kernel(noisy_grads=True))
    assert any(f["tensor"] == "repeat" and f["output"] == "dq" for f in answer["failures"]), answer


def test_the_lean_runtime_must_equal_fa4() -> None:
    answer = judged(FWD, kernel(), lean=kernel(out_scale=1.0 + 2**-7))
    assert answer["status"] == "wrong"
    assert [(f["tensor"], f["output"]) for f in answer["failures"]] == [("lean", "out")]


def test_a_kernel_that_raises_is_an_error_not_a_verdict() -> None:
    def missing(*_: Any, **__: Any) -> Any:
        raise KernelMissing("kernel abc is not in the store", sku="h200", family="f", kernel_key="a" * 64,
                            compile_key="")

    answer = judged(FWD, missing)
    assert answer["status"] == "error" and "not in the store" in answer["detail"]


@pytest.mark.parametrize("lost", [True, False], ids=["context lost", "context kept"])
def test_h200_default_certify_out_of_memory_is_not_a_crash(monkeypatch: pytest.MonkeyPatch, lost: bool) -> None:
    # The default h200 build's certification at -j 16 on the H200 (2026-12-03): 16 workers kept PyTorch's cached
    # memory (one 39 GiB), and a tiny call (bwd varlen bf16 d=64 causal h=6:1 batch=1 max_seqlen_q=28 total_q=1
    # total_k=1 heads_kv=1) met a full GPU: "AcceleratorError: CUDA error: out of memory",
    # then the context check failed too, so 8 kernels got a crash verdict and a measured known-bad entry.
    monkeypatch.setattr(checker, "_cuda_lost", lambda: lost)
    answer = checker._failed("c1", torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors ..."), "cuda")
    assert answer["status"] == "error" and "not a kernel fault" in answer["detail"], answer
    assert "CUDA error: out of memory" in answer["detail"]
    assert answer.get("restart", False) is lost  # a lost context still costs the worker (pool.py replaces it)
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2687.96 GiB. GPU 0 has a total capacity ...")
    assert checker._failed("c2", oom, "cuda")["status"] == "error"
    # ... and whatever a journal from before kept, blame gives no verdict and no known-bad entry for it
    check = Check(dataclasses.replace(BWD, layout="varlen"), POINT, (Use("_flash_attn_bwd", "b" * 64),), "small", 1)
    journalled = Outcome("c1", check, "crash", "fwd", [], "AcceleratorError: CUDA error: out of memory")
    assert blame.verdicts([journalled], "nvidia-h200", "t") == [] and blame.failing_parts(journalled) == set()


def test_a_lost_context_without_memory_words_is_still_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checker, "_cuda_lost", lambda: True)
    error = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    assert checker._failed("c1", error, "cuda")["status"] == "crash"


def test_a_worker_keeps_to_its_share_of_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: asked.append((f, d)))
    monkeypatch.setenv("FA4_AOT_CERTIFY_JOBS", "16")
    checker._limit_memory()
    assert asked == [(pytest.approx(0.9 / 16), 0)]


def once(wrong: Callable[..., Any], right: Callable[..., Any]) -> Callable[..., Any]:
    """A kernel that computes `wrong` on its first call (one seed's inputs) and `right` ever after."""
    calls: list[None] = []

    def attend(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return (wrong if len(calls) == 1 else right)(*args, **kwargs)

    return attend


def test_a_marginal_miss_at_one_seed_is_not_wrong() -> None:
    """A miss of a few times the bound that the check's other seeds (float64 reference) do not reproduce is
    rounding at a degenerate size, not a defect: the check passes and names the miss as marginal."""
    answer = judged(FWD, once(kernel(out_scale=1.0 + 2**-6), kernel()))
    assert answer["status"] == "pass", answer
    (miss,) = answer["marginal"]
    assert miss["tensor"] == "out" and miss["ratios"][0] > 1 and miss["ratios"][1:] == [0.0] * reproduce.REPEATS


def test_a_miss_at_every_seed_is_wrong() -> None:
    answer = judged(FWD, kernel(out_scale=1.0 + 2**-6))
    assert answer["status"] == "wrong" and "marginal" not in answer, answer
    (failure,) = answer["failures"]
    assert len(failure["ratios"]) == 1 + reproduce.REPEATS and min(failure["ratios"]) > reproduce.MARGIN


def test_a_gross_miss_at_one_seed_is_wrong() -> None:
    answer = judged(BWD, once(kernel(dq_scale=2.3), kernel()))
    assert answer["status"] == "wrong", answer
    assert [f["tensor"] for f in answer["failures"]] == ["dq"] and answer["failures"][0]["ratios"][0] > reproduce.GROSS


@pytest.mark.parametrize(("ratios", "wrong"), [
    ([1.08, 0.5, 0.99, 1.0, 1.0], False),  # FA4's JIT at seqlen_q 1, seqlen_k 2: rounding
    ([1.08, 0.99, 5.9, 1.0, 0.5], False),  # ... with its worst seed
    ([1.9, 1.6, 1.4, 0.9, 1.3], True),  # a systematic miss
    ([1.02, 0, 0, 0, 11.0], True),  # past GROSS once
    ([math.inf, 0, 0, 0, 0], True),  # NaN, a missing tensor, a bitwise difference
])
def test_the_marginal_rule(ratios: list[float], wrong: bool) -> None:
    assert reproduce.holds(ratios) is wrong
