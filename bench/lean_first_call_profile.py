"""Where a fresh lean process spends its time until the first fwd+bwd output, phase by phase.

Fresh processes, each timing: `import torch`, `import fa4_aot`, input tensors, the first forward (Python, then
to the end of the GPU work), the first backward (likewise). Modes: `lean` (fa4_aot.flash_attn_func), `torch` (the
same phases with a bare torch matmul forward and backward instead of attention: what any PyTorch process pays for
its first autograd call), and `lean` under cProfile (the top functions by cumulative time, to name what is slow).

    FA4_AOT_CACHE=<store of tests/data/lean_variants.toml> python bench/lean_first_call_profile.py OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import time
t = [("start", time.perf_counter())]
import sys, json
mode, profile = sys.argv[1], sys.argv[2] == "1"
import torch
t.append(("import torch", time.perf_counter()))
if profile:
    import cProfile, pstats, io
    prof = cProfile.Profile()
    prof.enable()
if mode == "lean":
    import fa4_aot
    fn = fa4_aot.flash_attn_func
t.append(("import fa4_aot", time.perf_counter()))
b, s, h, hkv, d = 2, 4096, 32, 8, 128
q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
torch.cuda.synchronize()
t.append(("inputs", time.perf_counter()))
if mode == "lean":
    out, lse = fn(q, k, v, causal=True)
else:
    out = (q.reshape(-1, d) @ k.reshape(-1, d)[: d].T).reshape(b, s, h, d)
t.append(("forward (host)", time.perf_counter()))
torch.cuda.synchronize()
t.append(("forward (GPU)", time.perf_counter()))
out.float().sum().backward()  # a training step's loss.backward()
t.append(("backward (host)", time.perf_counter()))
torch.cuda.synchronize()
t.append(("backward (GPU)", time.perf_counter()))
phases = {name: round(t[i][1] - t[i - 1][1], 4) for i, (name, _) in enumerate(t) if i}
doc = {"mode": mode, "phases": phases, "total_s": round(t[-1][1] - t[0][1], 3)}
if profile:
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    doc["profile"] = buf.getvalue()
print(json.dumps(doc))
"""


def child(mode: str, profile: bool, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, "1" if profile else "0"], capture_output=True,
                          text=True, env=env, timeout=600)
    if done.returncode:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ)
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):  # alternated
        for mode in ("lean", "torch"):
            runs.setdefault(mode, []).append(child(mode, False, env))
        runs.setdefault("lean_eager_modules", []).append(child("lean", False, {**env, "CUDA_MODULE_LOADING": "EAGER"}))
    doc = {"date": time.strftime("%Y-%m-%d"), "runs": runs, "profile": child("lean", True, env)["profile"]}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for mode, rs in runs.items():
        print(mode, [r["total_s"] for r in rs])
        for r in rs:
            print("   ", r["phases"])
    print(doc["profile"])


if __name__ == "__main__":
    main()
