"""certify.reference against FA4's own test reference (flash_attn.cute.testing.attention_ref, float64): the same
definition of masks, windows, softcap, sinks, GQA, LSE and empty rows, and the same gradients. Skipped where FA4 is
not installed; the package never imports FA4, the test does."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from fa4_aot.certify.inputs import make_inputs
from fa4_aot.certify.reference import reference
from fa4_aot.domain.signature import Signature

testing = pytest.importorskip("flash_attn.cute.testing")
F64 = torch.float64
SIG = Signature(layout="dense", pass_="bwd", dtype="bf16", head_dim=32, head_dim_v=32, mask="full", window=(0, 0),
                softcap=0.0, sink=False, num_splits=1, heads_q=6, heads_kv=2)
CASES = [  # mask, window, sq, sk, softcap, sink
    ("full", (0, 0), 7, 13, 0.0, False), ("causal", (0, 0), 13, 7, 0.0, True), ("causal", (0, 0), 5, 16, 4.0, False),
    ("local", (3, 2), 11, 11, 0.0, True), ("local", (0, 4), 6, 15, 8.0, True), ("local", (5, 0), 15, 6, 0.0, False),
    ("full", (0, 0), 1, 9, 2.0, True), ("causal", (0, 0), 9, 1, 0.0, False),
]


def fa4_window(mask: str, window: tuple[int, int]) -> tuple[Any, Any]:
    return window if mask == "local" else (None, None)


@pytest.mark.parametrize("mask,window,sq,sk,softcap,sink", CASES)
def test_equals_fa4s_attention_ref(mask: str, window: tuple[int, int], sq: int, sk: int, softcap: float,
                                   sink: bool) -> None:
    sig = dataclasses.replace(SIG, mask=mask, window=window, softcap=softcap, sink=sink)
    inputs = make_inputs(sig, {"batch": 2, "seqlen_q": sq, "seqlen_k": sk, "heads_kv": 2}, sq + sk, "cpu")
    mine = reference(inputs, sig, dtype=F64)
    t = {n: x.detach().to(F64).requires_grad_() for n, x in inputs.tensors.items()}
    out, _, lse = testing.attention_ref(t["q"], t["k"], t["v"], causal=mask == "causal",
                                        window_size=fa4_window(mask, window), softcap=softcap,
                                        learnable_sink=t.get("learnable_sink"), upcast=False, return_lse=True)
    atol = 1e-6 if sink else 1e-10  # attention_ref runs a sink's softmax in float32 whatever the inputs
    assert mine.lse is not None and torch.equal(torch.isinf(mine.lse), torch.isinf(lse))
    assert torch.allclose(mine.out, out, atol=atol) and torch.allclose(mine.lse, lse, atol=atol)
    if (mask != "full" and sk < sq) or inputs.dout is None:
        return  # FA4's reference has NaN gradients on empty rows; its tests skip these backwards too
    grads = torch.autograd.grad(out, list(t.values()), inputs.dout.to(F64))
    names = {"q": "dq", "k": "dk", "v": "dv", "learnable_sink": "dsink"}
    for name, grad in zip(t, grads, strict=True):
        got = mine.get(names[name])
        assert got is not None and torch.allclose(got, grad, atol=10 * atol), name
