"""On-demand builds on one GPU host (issue 21): seconds from a lean process's miss to its correct output with a
warm builder on the host's CPUs, and the compile count when N processes miss the same kernel at once.

    python bench/on_demand.py --clients 8 --jobs 8 --out bench/on_demand-h200-DATE.json

Sets up, in a temp folder: a server (`fa4-aot serve`, SQLite) whose store holds one seed kernel (so it knows the
SKU), a publish token, and `fa4-aot builder -j JOBS` with its own store. Then, each phase a signature no store
holds (a softcap value of its own: FA4 compiles one forward kernel per softcap value), every client a fresh
`python` process with an empty store, FA4_AOT_SERVER, FA4_AOT_BUILD_WAIT=120 and FA4_AOT_INSECURE=1 (the builds
are unsigned), calling fa4_aot.flash_attn_func on real tensors and checking the output against an fp32 reference:
  cold  one client, the builder's first job (its workers import FA4 then)
  warm  one client, the builder warm: the figure the issue's goal (< 15 s) is about
  herd  N clients at once on one new signature: the server's job count and the kernels compiled for them (goal 1)
Prints and writes one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.netutil import free_port, wait_up  # noqa: E402

SEED = {"layout": "dense", "pass_": "fwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
        "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 1, "seqlen_q": 512,
        "seqlen_k": 512, "heads_q": 8, "heads_kv": 2, "page_size": 0}
CLIENT = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, fa4_aot
softcap = float(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
torch.cuda.synchronize()
t1 = time.perf_counter()
out, _lse = fa4_aot.flash_attn_func(q, k, v, causal=True, softcap=softcap)
torch.cuda.synchronize()
t2 = time.perf_counter()
qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
kf, vf = (x.repeat_interleave(4, dim=1) for x in (kf, vf))
s = qf @ kf.transpose(-1, -2) / 128 ** 0.5
s = softcap * torch.tanh(s / softcap)
s = s.masked_fill(torch.ones(1024, 1024, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
ref = (s.softmax(-1) @ vf).transpose(1, 2)
err = ((out.float() - ref).norm() / ref.norm()).item()
print(json.dumps({"import_s": t1 - t0, "miss_to_output_s": t2 - t1, "rel_err": err}))
"""


def cli(*args: str, cache: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fa4_aot", "--cache-dir", str(cache), *args], capture_output=True,
                          text=True, cwd=ROOT, check=True, **kw)


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "fa4_aot", *args], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def client(url: str, softcap: float, folder: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    folder.mkdir(parents=True)
    env.update(FA4_AOT_CACHE=str(folder), FA4_AOT_SERVER=url, FA4_AOT_BUILD_WAIT="120", FA4_AOT_INSECURE="1")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CLIENT, str(softcap)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "process_s": time.perf_counter() - started}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - started}


def jobs_for(url: str, softcap: float) -> list[dict[str, Any]]:
    found = httpx.get(f"{url}/v1/builds?limit=1000", timeout=30).json()
    return [j for j in found if (j.get("call") or {}).get("softcap") == softcap]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--out", type=Path)
    a = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fa4-aot-on-demand-"))
    served, building = tmp / "server", tmp / "builder"
    (tmp / "seed.jsonl").write_text(json.dumps(SEED) + "\n")
    t = time.perf_counter()
    cli("build", "--sku", "h200", "--calls", str(tmp / "seed.jsonl"), "-j", "2", cache=served)
    seed_s = time.perf_counter() - t
    token = cli("token", "create", "--scope", "publish", "--name", "builder", cache=served).stdout.split()[-1]
    url = f"http://127.0.0.1:{free_port()}"
    procs = [start(["--cache-dir", str(served), "serve", "--port", url.rsplit(":", 1)[1]], tmp / "server.log")]
    try:
        wait_up(f"{url}/healthz")
        procs.append(start(["--cache-dir", str(building), "builder", "--server", url, "--token", token, "-j",
                            str(a.jobs), "--poll", "0.1"], tmp / "builder.log"))
        result = phases(url, a.clients, tmp)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    result.update(seed_build_s=round(seed_s, 1), builder_jobs=a.jobs, host_cpus=os.cpu_count(), folder=str(tmp))
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


def phases(url: str, n: int, tmp: Path) -> dict[str, Any]:
    cold = client(url, 5.0, tmp / "cold")
    warm = client(url, 7.0, tmp / "warm")
    with ThreadPoolExecutor(n) as pool:
        herd = list(pool.map(lambda i: client(url, 9.0, tmp / f"herd{i}"), range(n)))
    herd_jobs = jobs_for(url, 9.0)
    return {
        "cold": cold, "warm": warm, "herd": herd,
        "herd_jobs": len(herd_jobs), "herd_kernels_compiled": sum(j["built"] for j in herd_jobs),
        "herd_reports": sum(j["reports"] for j in herd_jobs),
        "herd_max_miss_to_output_s": max((c.get("miss_to_output_s", 0.0) for c in herd), default=0.0),
        "herd_correct": sum(c.get("rel_err", 1.0) < 2e-2 for c in herd),
        "jobs": {str(s): jobs_for(url, s) for s in (5.0, 7.0)},
    }


if __name__ == "__main__":
    main()
