"""The checker's judging (fa4_aot/certify/checker.py) on the CPU, with the real inputs and fp32 reference and
stand-in kernels: torch's own attention in the input precision (right), and the same with one defect each (a wrong
output, a wrong dq, a deterministic backward that does not repeat, a lean runtime that differs from FA4, a kernel
that raises). FA4's kernels themselves run only on a GPU: tests/gpu/test_h200_certify.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fa4_aot.certify.checker import Runtimes, run
from fa4_aot.certify.plan import Check, Use
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

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, **_: Any) -> Any:
        if dq_scale != 1.0:
            q = _ScaleGrad.apply(q, dq_scale)
        if noisy_grads:
            q = _ScaleGrad.apply(q, 1.0 + float(torch.rand(())) * 1e-2)
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
