"""The TIRx FA4 family on a Blackwell GPU (sm_100): build the kernel of two small problems for this device's SKU on
this host (the TIRx environment and nvcc 13.0), load it strictly through fa4_aot.load(..., family="tirx") and the
project's own launcher (tensor maps encoded on the host, cuLaunchKernel), and compare with an fp32 reference.
Skips elsewhere, saying so: no sm_100 GPU was available where this was written (an H200 is sm_90)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import fa4_aot
from fa4_aot import config
from fa4_aot.domain import devices, sku_table
from fa4_aot.store import Store
from fa4_aot.tirx.problem import Problem
from fa4_aot.tirx.producer import build

pytestmark = pytest.mark.gpu
PROBLEMS = ["b1-q256-k256-h4-kv4-d128-full", "b1-q512-k512-h8-kv2-d128-causal"]


@pytest.fixture(scope="module", autouse=True)
def sm_100() -> None:
    import torch

    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    if capability is not None and capability != (10, 0):
        pytest.skip(f"the TIRx FA4 kernel is sm_100a; this GPU is sm_{capability[0]}{capability[1]}")


def reference(q, k, v, causal: bool):  # type: ignore[no-untyped-def]
    import torch

    group = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)))
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1),
                                    float("-inf"))
    return (scores.softmax(-1) @ vf).transpose(1, 2)


@pytest.mark.parametrize("text", PROBLEMS)
def test_tirx_kernel_matches_fp32_reference(text: str, tmp_path: Path) -> None:
    import torch

    table = sku_table.table(config.default_variants_file())
    sku = devices.this_device(table).sku
    p = Problem.parse(text)
    report = build(Store(tmp_path), sku, [(p, "gpu-test")])
    assert report.failed == []
    torch.manual_seed(0)
    q = torch.randn(p.batch, p.seqlen_q, p.heads_q, 128, dtype=torch.float16, device="cuda")
    k, v = (torch.randn(p.batch, p.seqlen_kv, p.heads_kv, 128, dtype=torch.float16, device="cuda") for _ in range(2))
    attn = fa4_aot.load(tuple(q.shape), tuple(k.shape), causal=p.causal, family="tirx", cache_dir=tmp_path)
    out = attn(q, k, v)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), reference(q, k, v, p.causal), rtol=2e-2, atol=2e-2)
