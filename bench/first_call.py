"""First-call latency and kernel time: AOT from the store vs FA4's own JIT, side by side, on a GPU.

Each first-call figure is a fresh Python process (as a new rank of a job would be): time from just before
the first FA4 call to its result, after torch and FA4 are imported; for AOT modes the timed part starts
with fa4_aot.install() (SKU detection, trust setup, store and server access are part of a cold start). With
--server, a third mode starts each process with an empty local cache and FA4_AOT_SERVER set, so its
first call downloads the kernels. Kernel time: the same call timed with CUDA events, AOT-loaded vs
JIT-compiled kernels, in one process.

    python bench/first_call.py [--server URL] --out bench/out/first_call.json
    (needs FA4_AOT_CACHE, or cache/, to hold the store built for this GPU's SKU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import sys, time, json, torch
mode = sys.argv[1]
from flash_attn.cute import flash_attn_func
if mode != "jit":
    import fa4_aot
q, k, v = (torch.randn(2, 4096, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
torch.cuda.synchronize()
t0 = time.perf_counter()
if mode != "jit":
    fa4_aot.install("strict")  # timed: SKU detection, trust setup and store access are part of the cold start
out = flash_attn_func(q, k, v, causal=True)[0]
torch.cuda.synchronize()
t1 = time.perf_counter()
out.float().sum().backward()
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"fwd_first_ms": (t1 - t0) * 1e3, "fwd_bwd_first_ms": (t2 - t0) * 1e3}))
"""


def first_calls(mode: str, repeats: int, server: str | None = None, trusted: str | None = None
                ) -> list[dict[str, float]]:
    """Fresh processes in `mode`: jit; aot (local store); server (empty cache + server); a `-verified` suffix
    sets FA4_AOT_TRUSTED_KEYS (signature checks on), otherwise server modes set FA4_AOT_INSECURE=1."""
    runs = []
    for _ in range(repeats):
        env = {k: v for k, v in os.environ.items() if k not in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_INSECURE")}
        if mode.startswith("server"):
            env.update(FA4_AOT_CACHE=tempfile.mkdtemp(prefix="fa4-aot-empty-"), FA4_AOT_SERVER=server or "")
        if mode.endswith("-verified"):
            env["FA4_AOT_TRUSTED_KEYS"] = trusted or ""
        elif mode.startswith("server"):
            env["FA4_AOT_INSECURE"] = "1"
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env)
        if out.returncode:
            sys.exit(f"{mode} child failed:\n{out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def kernel_times(iters: int) -> dict[str, float]:
    import torch
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.cache_utils import JITCache

    import fa4_aot
    from fa4_aot.fa4 import caches

    fa4_aot.install("strict")
    q, k, v = (torch.randn(2, 4096, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def timed() -> float:
        for _ in range(5):
            flash_attn_func(q, k, v, causal=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            flash_attn_func(q, k, v, causal=True)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    aot = timed()
    with caches.swapped(lambda family, old: JITCache()):
        jit = timed()
    aot_again = timed()
    return {"aot_ms": min(aot, aot_again), "jit_ms": jit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--server", help="also time processes that start with an empty cache and this server")
    parser.add_argument("--trusted-keys", help="also time every AOT mode with signature checks on (the public key "
                                               "line whose signed manifest is in the store and on the server)")
    parser.add_argument("--out")
    args = parser.parse_args()
    started = time.time()
    aot = first_calls("aot", args.repeats)
    jit = first_calls("jit", args.repeats)
    remote = first_calls("server", args.repeats, args.server) if args.server else None
    verified = {}
    if args.trusted_keys:
        verified["aot"] = first_calls("aot-verified", args.repeats, trusted=args.trusted_keys)
        if args.server:
            verified["server"] = first_calls("server-verified", args.repeats, args.server, args.trusted_keys)
    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    kt = kernel_times(args.iters)
    import torch

    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "repeats": args.repeats,
        "aot_fwd_first_ms": med(aot, "fwd_first_ms"), "jit_fwd_first_ms": med(jit, "fwd_first_ms"),
        "aot_fwd_bwd_first_ms": med(aot, "fwd_bwd_first_ms"), "jit_fwd_bwd_first_ms": med(jit, "fwd_bwd_first_ms"),
        **kt, "wall_s": time.time() - started, "aot_runs": aot, "jit_runs": jit, "server_runs": remote,
    }
    for name, runs in verified.items():
        result[f"{name}_verified_runs"] = runs
        for key in ("fwd_first_ms", "fwd_bwd_first_ms"):
            result[f"{name}_verified_{key}"] = med(runs, key)
    if remote:
        result["server_fwd_first_ms"] = med(remote, "fwd_first_ms")
        result["server_fwd_bwd_first_ms"] = med(remote, "fwd_bwd_first_ms")
    rows = [
        ("first fwd call, fresh process (ms)", result["aot_fwd_first_ms"], result["jit_fwd_first_ms"]),
        ("first fwd+bwd, fresh process (ms)", result["aot_fwd_bwd_first_ms"], result["jit_fwd_bwd_first_ms"]),
        ("fwd kernel time, b2 s4096 h32 d128 causal (ms)", result["aot_ms"], result["jit_ms"]),
    ]
    print(f"{'measure':<48}{'AOT':>12}{'JIT':>12}{'JIT/AOT':>10}")
    for name, a, j in rows:
        print(f"{name:<48}{a:>12.3f}{j:>12.3f}{j / a:>10.1f}")
    if remote:
        for key, label in (("fwd_first_ms", "first fwd"), ("fwd_bwd_first_ms", "first fwd+bwd")):
            s, a, j = result[f"server_{key}"], result[f"aot_{key}"], result[f"jit_{key}"]
            print(f"{label}: server (empty cache) {s:.1f} ms, local store {a:.1f} ms, JIT {j:.1f} ms "
                  f"(JIT/server {j / s:.0f}x)")
    for name in verified:
        for key, label in (("fwd_first_ms", "first fwd"), ("fwd_bwd_first_ms", "first fwd+bwd")):
            on, off = result[f"{name}_verified_{key}"], result[f"{name}_{key}"]
            print(f"{label}, {name}: signature checks on {on:.1f} ms, off {off:.1f} ms ({(on / off - 1) * 100:+.1f}%)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
