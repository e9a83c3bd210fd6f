"""On a GPU: a fresh process with an empty local cache gets every kernel from a server and never compiles.

The server is a real `fa4-aot serve` on 127.0.0.1 over the store the other GPU tests use (FA4_AOT_CACHE).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

WORKLOAD = r"""
import json, torch, cutlass.cute as cute
import fa4_aot
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
compiles = 0
real = cute.compile
def counting(*a, **k):
    global compiles
    compiles += 1
    return real(*a, **k)
cute.compile = counting
inst = fa4_aot.install("strict")
for (b, s, h, hkv, d) in [(2, 4096, 32, 8, 128), (4, 1024, 16, 16, 64), (1, 2048, 16, 16, 256)]:
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = flash_attn_func(q, k, v, causal=True)
    out.float().sum().backward()
attn = fa4_aot.load((8, 1024, 32, 128), (8, 1024, 8, 128), causal=True, layout="varlen")
torch.cuda.synchronize()
print(json.dumps({"compiles": compiles, "fetched": inst.stats.fetched, "loaded": inst.stats.loaded,
                  "compiled": inst.stats.compiled}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    store = os.environ.get("FA4_AOT_CACHE")
    if not store:
        pytest.skip("set FA4_AOT_CACHE to a store built for this GPU's SKU")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fa4_aot", "--cache-dir", store, "serve", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"server did not start: {proc.stderr.read()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_fresh_process_with_empty_cache_runs_from_server_with_zero_compiles(server, tmp_path: Path):
    env = {**os.environ, "FA4_AOT_CACHE": str(tmp_path / "empty"), "FA4_AOT_SERVER": server}
    out = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["compiles"] == 0 and stats["compiled"] == 0
    assert stats["fetched"] >= 8 and stats["loaded"] == stats["fetched"]
