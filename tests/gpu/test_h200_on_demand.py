"""On the H200 (issue 21, point 4): a lean process calling a signature no store holds gets FA4's own output after
an on-demand build, and compiles nothing itself.

A real server (`fa4-aot serve`, SQLite) seeded with one kernel of the SKU, a real `fa4-aot builder` on this host's
CPUs (bench/on_demand.py sets both up the same way), then:
1. a fresh lean process (empty store, FA4_AOT_BUILD_WAIT) calls flash_attn_func with a softcap value nobody built
   (FA4 compiles one forward kernel per softcap value): it waits for the job, fetches the kernel, its library
   and its recipe, and saves its output;
2. a fresh FA4 process over `fa4_aot.install("strict")` on that very store runs the same call on the same tensors:
   zero compiles, and the lean output must equal FA4's bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

SOFTCAP = 13.0  # a softcap value no build holds: its kernel exists only after the on-demand build
INPUTS = r"""
import torch
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(2, 1024, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
"""
LEAN = INPUTS + r"""
import sys, torch, fa4_aot
out, _ = fa4_aot.flash_attn_func(q, k, v, causal=True, softcap=float(sys.argv[1]))
torch.cuda.synchronize()
torch.save(out.cpu(), sys.argv[2])
assert "flash_attn" not in sys.modules and "cutlass" not in sys.modules, "the lean process imported FA4"
"""
FA4 = INPUTS + r"""
import sys, json, torch, fa4_aot
inst = fa4_aot.install("strict")
from flash_attn.cute import flash_attn_func
out, _ = flash_attn_func(q, k, v, causal=True, softcap=float(sys.argv[1]))
torch.cuda.synchronize()
print(json.dumps({"equal": bool(torch.equal(out.cpu(), torch.load(sys.argv[2]))), "compiled": inst.stats.compiled}))
"""


def _python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """(server URL, temp folder): a seeded server and a warm-able builder, both stopped after the module."""
    sys.path.insert(0, str(ROOT))
    from bench import on_demand

    tmp = tmp_path_factory.mktemp("on-demand")
    served = tmp / "server"
    (tmp / "seed.jsonl").write_text(json.dumps(on_demand.SEED) + "\n")
    on_demand.cli("build", "--sku", "h200", "--calls", str(tmp / "seed.jsonl"), "-j", "2", cache=served)
    token = on_demand.cli("token", "create", "--scope", "publish", "--name", "builder", cache=served).stdout.split()[-1]
    url = f"http://127.0.0.1:{on_demand.free_port()}"
    procs = [on_demand.start(["--cache-dir", str(served), "serve", "--port", url.rsplit(":", 1)[1]],
                             tmp / "server.log")]
    try:
        on_demand.wait_up(f"{url}/healthz")
        procs.append(on_demand.start(["--cache-dir", str(tmp / "builder"), "builder", "--server", url, "--token",
                                      token, "-j", "4", "--poll", "0.1"], tmp / "builder.log"))
        yield url, tmp
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)


def test_lean_miss_is_built_on_demand_and_equals_fa4_bitwise(cluster) -> None:
    url, tmp = cluster
    store, saved = tmp / "client", tmp / "lean-out.pt"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    env.update(FA4_AOT_CACHE=str(store), FA4_AOT_SERVER=url, FA4_AOT_BUILD_WAIT="300", FA4_AOT_INSECURE="1")
    lean = _python(LEAN, env, str(SOFTCAP), str(saved))
    assert lean.returncode == 0, lean.stderr[-3000:] + (tmp / "builder.log").read_text()[-3000:]
    offline = {k: v for k, v in env.items() if k not in ("FA4_AOT_SERVER", "FA4_AOT_BUILD_WAIT")}
    fa4 = _python(FA4, offline, str(SOFTCAP), str(saved))
    assert fa4.returncode == 0, fa4.stderr[-3000:]
    result = json.loads(fa4.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 0, f"FA4 compiled {result['compiled']} kernel(s): the build did not serve it"
    assert result["equal"], "the lean output after the on-demand build differs from FA4's on the same store"
