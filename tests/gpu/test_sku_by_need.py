"""On the H200 (issue 13): devices match by need. With a SKU table that lacks the H200's L2 figure, or lacks the
H200 row entirely (another sm_90a row present), strict mode still runs every kernel of the h200 build with 0
compiles: none of them consumed the L2 size, and the SM count they may consume equals the device's.

Needs the store (cache/ or FA4_AOT_CACHE) to hold the h200 build of the GPU tests' calls made by this version
(`fa4-aot build --sku h200 --calls tests/data/gpu_calls.jsonl`, or an older store after `fa4-aot migrate`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

H100_SXM = 'arch = "sm_90a"\nsm_count = 132\nl2_bytes = 52428800\ncuda_major = 13\n'
TABLES = {
    # the H200 row with another L2 figure (e.g. copied from a spec sheet): no row has the device's exact figures
    "h200-without-its-l2": '[skus.h200]\narch = "sm_90a"\nsm_count = 132\nl2_bytes = 50331648\ncuda_major = 13\n',
    # no H200 row at all; an sm_90a row with other figures serves it by arch and CUDA major
    "no-h200-row": f"[skus.h100-sxm]\n{H100_SXM}",
}

CHILD = r"""
import json, sys, torch
import cutlass.cute as cute
import fa4_aot, fa4_aot.client
inst = fa4_aot.install("strict", variants_file=sys.argv[1])
real, count = cute.compile, {"n": 0}
def counting(*a, **k):
    count["n"] += 1
    return real(*a, **k)
cute.compile = counting
cases = [
    dict(causal=True, training=True, shapes=((2, 4096, 32, 128), (2, 4096, 8, 128))),
    dict(causal=True, training=True, deterministic=True, shapes=((2, 2048, 16, 128), (2, 2048, 16, 128))),
    dict(causal=False, training=True, shapes=((8, 512, 16, 64), (8, 512, 16, 64))),
]
for case in cases:
    (qs, ks) = case.pop("shapes")
    attn = fa4_aot.client.prepare(qs, ks, **case)  # through FA4 (install path); fa4_aot.load is the lean runtime
    q = torch.randn(qs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(ks, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = attn(q, k, v)
    (out[0] if isinstance(out, tuple) else out).float().square().sum().backward()
torch.cuda.synchronize()
print(json.dumps({"sku": inst.sku.name, "trace": inst.trace, "compiles": count["n"],
                  "compiled": inst.stats.compiled, "loaded": inst.stats.loaded}))
"""


@pytest.mark.parametrize("table", list(TABLES))
def test_strict_mode_runs_by_need_with_zero_compiles(tmp_path: Path, table: str) -> None:
    variants = tmp_path / "variants.toml"
    variants.write_text(TABLES[table])
    env = {k: v for k, v in os.environ.items() if k not in ("FA4_AOT_SKU", "FA4_AOT_SERVER")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(variants)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["sku"] == ("h200" if table == "h200-without-its-l2" else "h100-sxm")
    assert "serves this device by arch and CUDA major" in doc["trace"][-1]
    assert doc["compiles"] == 0 and doc["compiled"] == 0 and doc["loaded"] > 0, doc
