"""On a Hopper GPU of any SKU of the table (h100-sxm, h200): the certifier in the on-demand flow. A real server
(`fa4-aot serve`, SQLite) seeded with one kernel, a real `fa4-aot builder` on this host's CPUs and a real `fa4-aot
certifier` on its GPU (as bench/on_demand.py sets up the first two); then a fresh lean process with
FA4_AOT_CERTIFIED=require and FA4_AOT_BUILD_WAIT calls a signature no store holds (a softcap value of its own): it
waits for the build, then for the certification of what was built, and runs the kernel only once it passed on this
GPU. Its output is right, its store holds the pass verdicts for this device class, and the server's certify jobs are
done by the certifier."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from fa4_aot.domain.devices import probe
from fa4_aot.store import Store
from tests.conftest import ROOT
from tests.gpu.skus import present_sku

pytestmark = pytest.mark.gpu

SOFTCAP = 17.0  # a softcap value no build holds: its kernel exists only after the on-demand build
LEAN = r"""
import json, sys, torch, fa4_aot
softcap = float(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
out, _ = fa4_aot.flash_attn_func(q, k, v, causal=True, softcap=softcap)
qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
kf, vf = (x.repeat_interleave(4, dim=1) for x in (kf, vf))
s = softcap * torch.tanh(qf @ kf.transpose(-1, -2) / 128 ** 0.5 / softcap)
s = s.masked_fill(torch.ones(1024, 1024, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
ref = (s.softmax(-1) @ vf).transpose(1, 2)
print(json.dumps({"rel_err": ((out.float() - ref).norm() / ref.norm()).item()}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """(server URL, temp folder): a seeded server, a builder and a certifier, all stopped after the module."""
    sys.path.insert(0, str(ROOT))
    from bench import on_demand

    tmp = tmp_path_factory.mktemp("certify-on-demand")
    served = tmp / "server"
    (tmp / "seed.jsonl").write_text(json.dumps(on_demand.SEED) + "\n")
    on_demand.cli("build", "--sku", present_sku(), "--calls", str(tmp / "seed.jsonl"), "-j", "8", cache=served)
    token = on_demand.cli("token", "create", "--scope", "publish", "--name", "builder", cache=served).stdout.split()[-1]
    url = f"http://127.0.0.1:{on_demand.free_port()}"
    procs = [on_demand.start(["--cache-dir", str(served), "serve", "--port", url.rsplit(":", 1)[1]],
                             tmp / "server.log")]
    try:
        on_demand.wait_up(f"{url}/healthz")
        procs.append(on_demand.start(["--cache-dir", str(tmp / "builder"), "builder", "--server", url, "--token",
                                      token, "-j", "8", "--poll", "0.1"], tmp / "builder.log"))
        procs.append(on_demand.start(["--cache-dir", str(tmp / "certifier"), "certifier", "--server", url, "--token",
                                      token, "--poll", "0.2"], tmp / "certifier.log", env={"FA4_AOT_INSECURE": "1"}))
        yield url, tmp
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(120)


def test_a_client_that_requires_certification_gets_the_built_kernel_once_it_passed(cluster) -> None:
    url, tmp = cluster
    store = tmp / "client"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    env.update(FA4_AOT_CACHE=str(store), FA4_AOT_SERVER=url, FA4_AOT_BUILD_WAIT="420", FA4_AOT_INSECURE="1",
               FA4_AOT_CERTIFIED="require")
    lean = subprocess.run([sys.executable, "-W", "ignore", "-c", LEAN, str(SOFTCAP)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    logs = "".join((tmp / name).read_text()[-3000:] for name in ("builder.log", "certifier.log"))
    assert lean.returncode == 0, lean.stderr[-3000:] + logs
    assert json.loads(lean.stdout.strip().splitlines()[-1])["rel_err"] < 0.02
    device = probe().device_class
    assert device is not None
    kept = {key: Store(store).verdicts(key) for key in Store(store).verdict_keys()}
    assert kept and all(v.device == device.id and v.passed for found in kept.values() for v in found), kept
    jobs = httpx.get(f"{url}/v1/certify-jobs", params={"status": "done"}, timeout=30).json()
    by_key = {j["kernel_key"]: j for j in jobs}
    for key in kept:  # each kernel the client ran was certified by the certifier, as the server records it
        assert by_key[key]["verdict"] == "pass" and by_key[key]["device"] == device.id, by_key.get(key)
