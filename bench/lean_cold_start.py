"""Cold start and steady state of the lean runtime against FA4 (install() over the store, and FA4's JIT).

Cold start: fresh Python processes, modes alternated round by round, each timing interpreter start to its first
output (the child's first statement to after torch.cuda.synchronize(); the parent's wall time of the whole
process is kept as well). Modes: lean fwd, lean fwd+bwd (fa4_aot.flash_attn_func), install fwd / fwd+bwd
(fa4_aot.install() then FA4's flash_attn_func), jit fwd / fwd+bwd (FA4 alone, its disk cache off), and torch
(bare `import torch` plus one kernel launch). The fwd+bwd modes take `out.float().sum().backward()`, as a training
step's loss.backward() does. Steady state: one process, lean and FA4-over-the-store calls
alternated in blocks, per-call wall time with CUDA sync, small and large shapes, fwd and fwd+bwd.

    FA4_AOT_CACHE=<store of tests/data/lean_variants.toml> python bench/lean_cold_start.py OUT.json [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPE = (2, 4096, 32, 8, 128)  # Llama-3-8B attention: batch, seqlen, heads, KV heads, head dim
CHILD = r"""
import time
t_start = time.perf_counter()
import sys, json
mode, train = sys.argv[1], sys.argv[2] == "1"
b, s, h, hkv, d = json.loads(sys.argv[3])
import torch
t_torch = time.perf_counter()
if mode == "torch":
    x = torch.ones(1024, device="cuda")
    out = x * 2
elif mode == "lean":
    import fa4_aot
    fn = fa4_aot.flash_attn_func
else:
    if mode == "install":
        import fa4_aot
        fa4_aot.install("strict")
    from flash_attn.cute import flash_attn_func as fn
if mode != "torch":
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=train)
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=train) for _ in range(2))
    out, lse = fn(q, k, v, causal=True)
    if train:  # a training step's loss.backward(): no explicit gradient tensor, which in torch itself imports
        out.float().sum().backward()  # sympy for 2 s (torch.autograd._make_grads; bench/lean_first_call_profile.py)
torch.cuda.synchronize()
t_end = time.perf_counter()
mods = sorted({m.split(".")[0] for m in sys.modules} & {"cutlass", "flash_attn", "quack"})
print(json.dumps({"first_output_s": t_end - t_start, "torch_import_s": t_torch - t_start, "imported": mods}))
"""

STEADY = r"""
import json, sys, time, torch, fa4_aot
fa4_aot.install("strict")
from flash_attn.cute import flash_attn_func as fa4_fn
shapes, iters = json.loads(sys.argv[1]), int(sys.argv[2])
results = []
for name, (b, s, h, hkv, d) in shapes.items():
    for train in (False, True):
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=train)
        k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=train) for _ in range(2))
        g = torch.ones(b, s, h, d, device="cuda", dtype=torch.bfloat16)

        def block(fn):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                out, _ = fn(q, k, v, causal=True)
                if train:
                    out.backward(g)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / iters * 1e6

        times = {"lean": [], "fa4": []}
        for fn in (fa4_aot.flash_attn_func, fa4_fn):
            block(fn)  # warm-up: loads, first launches
        for _ in range(5):  # alternate blocks: A B A B ...
            times["lean"].append(block(fa4_aot.flash_attn_func))
            times["fa4"].append(block(fa4_fn))
        lean_us, fa4_us = min(times["lean"]), min(times["fa4"])
        results.append({"shape": name, "dims": [b, s, h, hkv, d], "pass": "fwd+bwd" if train else "fwd",
                        "lean_us": round(lean_us, 1), "fa4_us": round(fa4_us, 1),
                        "lean_over_fa4": round(lean_us / fa4_us, 4), "blocks": times})
print(json.dumps(results))
"""


def _child(mode: str, train: bool) -> dict:
    env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, mode, "1" if train else "0", json.dumps(SHAPE)],
                          capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{mode} (train={train}) failed:\n{done.stderr[-4000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_wall_s": wall}


def cold_start(rounds: int) -> dict:
    modes = [("lean", False), ("lean", True), ("install", False), ("install", True), ("jit", False),
             ("jit", True), ("torch", False)]
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for mode, train in modes:
            name = mode if mode == "torch" else f"{mode}_{'fwd_bwd' if train else 'fwd'}"
            runs.setdefault(name, []).append(_child(mode, train))
    # `import torch` alone swings by a second from process to process on the GPU host; what follows it is the part
    # each mode adds, so the per-run difference is reported as well as the whole
    summary = {name: {"median_first_output_s": round(statistics.median(r["first_output_s"] for r in rs), 3),
                      "median_after_torch_import_s": round(statistics.median(
                          r["first_output_s"] - r["torch_import_s"] for r in rs), 3),
                      "runs": rs} for name, rs in runs.items()}
    return summary


def steady_state(iters: int) -> list:
    shapes = {"small": [1, 256, 32, 8, 128], "large": list(SHAPE)}
    done = subprocess.run([sys.executable, "-c", STEADY, json.dumps(shapes), str(iters)], capture_output=True,
                          text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"steady state failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    import torch

    doc = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "python": sys.version.split()[0], "shape": SHAPE, "cold_start": cold_start(args.rounds),
           "steady_state": steady_state(args.iters)}
    cs = doc["cold_start"]
    doc["lean_vs_install_speedup"] = round(cs["install_fwd_bwd"]["median_first_output_s"]
                                           / cs["lean_fwd_bwd"]["median_first_output_s"], 2)
    doc["lean_minus_torch_s"] = round(cs["lean_fwd_bwd"]["median_first_output_s"]
                                      - cs["torch"]["median_first_output_s"], 3)
    after = {name: v["median_after_torch_import_s"] for name, v in cs.items()}
    doc["after_torch_import"] = {
        "install_over_lean_fwd": round(after["install_fwd"] / after["lean_fwd"], 1),
        "install_over_lean_fwd_bwd": round(after["install_fwd_bwd"] / after["lean_fwd_bwd"], 1),
        "lean_fwd_bwd_minus_torch_s": round(after["lean_fwd_bwd"] - after["torch"], 3)}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: v for k, v in doc.items() if k != "cold_start"} | {
        "cold_start": {k: v["median_first_output_s"] for k, v in cs.items()}}, indent=1))


if __name__ == "__main__":
    main()
