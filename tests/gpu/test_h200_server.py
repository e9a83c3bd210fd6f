"""On a GPU: a fresh process with an empty local cache gets every kernel from a server and never compiles,
accepting only kernels listed by a manifest signed with a trusted key; a tampered object is refused.

The server is a real `fa4-aot serve` on 127.0.0.1 over a copy of the store the other GPU tests use
(FA4_AOT_CACHE: `fa4-aot build --sku h200 --calls tests/data/gpu_calls.jsonl`), signed with a key made for the
test and published with `fa4-aot push`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

# Every child counts the compiles FA4 starts (it calls cute.compile for each) and installs strict mode.
COUNTED = r"""
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
"""
WORKLOAD = COUNTED + r"""
for (b, s, h, hkv, d) in [(2, 4096, 32, 8, 128), (4, 1024, 16, 16, 64), (1, 2048, 16, 16, 256)]:
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = flash_attn_func(q, k, v, causal=True)
    out.float().sum().backward()
import fa4_aot.client
attn = fa4_aot.client.prepare((8, 1024, 32, 128), (8, 1024, 8, 128), causal=True, layout="varlen")
torch.cuda.synchronize()
print(json.dumps({"compiles": compiles, "fetched": inst.stats.fetched, "loaded": inst.stats.loaded,
                  "compiled": inst.stats.compiled}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-m", "fa4_aot", *args], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A copy of the store with a signed h200 manifest, and the trusted public key line."""
    source = os.environ.get("FA4_AOT_CACHE")
    if not source:
        pytest.skip("set FA4_AOT_CACHE to a store built for this GPU's SKU")
    root = tmp_path_factory.mktemp("signed")
    store = root / "store"
    shutil.copytree(source, store, ignore=shutil.ignore_patterns("*.db", "manifests"))
    public = _cli("keys", "generate", "--out", str(root / "keys"), "--name", "h200-build").splitlines()[-1]
    _cli("--cache-dir", str(store), "sign", "--sku", "h200", "--key", str(root / "keys" / "h200-build.key"))
    return {"store": str(store), "public": public}


@pytest.fixture(scope="module")
def server(signed: dict[str, str]):
    store = signed["store"]
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
    token = _cli("--cache-dir", store, "token", "create", "--scope", "publish").strip()
    _cli("--cache-dir", store, "push", "--server", url, "--token", token, "--sku", "h200")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_fresh_process_with_empty_cache_runs_from_server_with_zero_compiles(server, signed, tmp_path: Path):
    env = {**os.environ, "FA4_AOT_CACHE": str(tmp_path / "empty"), "FA4_AOT_SERVER": server,
           "FA4_AOT_TRUSTED_KEYS": signed["public"]}
    out = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["compiles"] == 0 and stats["compiled"] == 0
    assert stats["fetched"] >= 8 and stats["loaded"] == stats["fetched"]


def test_tampered_object_on_the_server_is_refused_naming_its_digest(server, signed, tmp_path: Path):
    """Flip one byte of every d=64 forward kernel's object on the server: the client's download of the one a
    d=64 forward needs fails its digest, and nothing is compiled or loaded."""
    from fa4_aot.store import Store

    store = Store(Path(signed["store"]))
    victims = {e.object_digest for e in store.entries("h200") if e.family == "_flash_attn_fwd" and " d=64 " in e.call}
    originals = {d: store.object_path(d).read_bytes() for d in victims}
    for digest, data in originals.items():
        store.object_path(digest).write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    env = {**os.environ, "FA4_AOT_CACHE": str(tmp_path / "empty"), "FA4_AOT_SERVER": server,
           "FA4_AOT_TRUSTED_KEYS": signed["public"]}
    try:
        out = subprocess.run([sys.executable, "-c", TAMPERED], env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    finally:
        for digest, data in originals.items():
            store.object_path(digest).write_bytes(data)
    assert out.returncode != 0
    # strict mode stops with the kernel missing, naming the download that failed its digest and that nothing of it
    # was stored (a tampered server is a miss with its reason, as an unreachable one is, not a crash elsewhere)
    assert "KernelMissing" in out.stderr and "nothing was stored" in out.stderr, out.stderr[-2000:]
    assert any(d in out.stderr for d in victims), out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"compiles": 0, "loaded": 0}


TAMPERED = COUNTED + r"""
q, k, v = (torch.randn(4, 1024, 16, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
try:
    flash_attn_func(q, k, v, causal=True)
finally:
    print(json.dumps({"compiles": compiles, "loaded": inst.stats.loaded}))
"""
