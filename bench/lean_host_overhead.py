"""Per-call cost of small, host-bound attention calls, side by side in one process (issue 17, point 4): torch SDPA,
the lean runtime (fa4_aot.flash_attn_func / flash_attn_varlen_func) and FA4 over fa4_aot.install() on the same
store's kernels; and the replay of a CUDA graph holding one captured lean decode step.

Calls (heads 32/8, head dim 128, bf16, causal): decode b1 sq1 sk512 (dense KV, and with seqused_k), prefill b1
s512. Each mode runs 1,000 calls after a warm-up per round, CUDA-synced before and after the loop (wall time / 1000),
modes interleaved within a round; the median round is reported. 'gpu_us' is one call's device time alone: 50 calls
captured in one CUDA graph, replayed, divided by 50 (what a call costs when the host keeps ahead of the GPU). The
graph rows replay one captured step per iteration (graph.replay() in the loop; new seqused_k contents need no
Python: they are written in place). A cProfile of the lean decode call's host path is kept in the JSON.

    FA4_AOT_CACHE=<store> python bench/lean_host_overhead.py --build --out bench/lean_host_overhead-h200-DATE.json

--build first builds the calls it runs into the store (`fa4-aot build --calls`, FA4 and its compiler installed).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HQ, HKV, D, SK, SP = 32, 8, 128, 512, 512
CALLS = [  # layout, batch, seqlen_q, seqlen_k, page_size: the forward calls the bench runs
    ("dense", 1, 1, SK, 0), ("dense", 1, SP, SP, 0), ("seqused", 1, 1, SK, 0), ("paged", 1, 1, SK, 16)]


def build(jobs: int) -> None:
    rows = [{"layout": layout, "pass_": "fwd", "dtype": "bf16", "head_dim": D, "head_dim_v": D, "mask": "causal",
             "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": b, "seqlen_q": sq,
             "seqlen_k": sk, "heads_q": HQ, "heads_kv": HKV, "page_size": ps} for layout, b, sq, sk, ps in CALLS]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        subprocess.run([sys.executable, "-m", "fa4_aot", "build", "--sku", "h200", "--calls", f.name, "-j",
                        str(jobs), "-q"], check=True)


def _inputs(torch: Any) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    q1, k1, v1 = randn(1, 1, HQ, D), randn(1, SK, HKV, D), randn(1, SK, HKV, D)
    qp, kp, vp = randn(1, SP, HQ, D), randn(1, SP, HKV, D), randn(1, SP, HKV, D)
    pool_k, pool_v = randn(SK // 16 * 2, 16, HKV, D), randn(SK // 16 * 2, 16, HKV, D)
    return {"decode": (q1, k1, v1), "prefill": (qp, kp, vp), "pool": (pool_k, pool_v),
            "used": torch.tensor([SK - 37], device="cuda", dtype=torch.int32),
            "table": torch.randperm(SK // 16 * 2, device="cuda", generator=g)[:SK // 16].view(1, -1).to(torch.int32),
            # SDPA takes (batch, heads, seqlen, dim): made contiguous once, outside the timed calls
            "sdpa_decode": tuple(t.transpose(1, 2).contiguous() for t in (q1, k1, v1)),
            "sdpa_prefill": tuple(t.transpose(1, 2).contiguous() for t in (qp, kp, vp))}


def callables(torch: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """{call: {mode: zero-argument function}} and the inputs."""
    import torch.nn.functional as F

    import fa4_aot

    fa4_aot.install("strict")
    from flash_attn.cute import flash_attn_func as fa4_dense
    from flash_attn.cute import flash_attn_varlen_func as fa4_varlen

    x = _inputs(torch)
    (q1, k1, v1), (qp, kp, vp), (pk, pv), used, table = x["decode"], x["prefill"], x["pool"], x["used"], x["table"]
    sd, sp = x["sdpa_decode"], x["sdpa_prefill"]
    lean_dense, lean_varlen = fa4_aot.flash_attn_func, fa4_aot.flash_attn_varlen_func
    calls = {
        "decode b1 sk512": {
            "sdpa": lambda: F.scaled_dot_product_attention(*sd, enable_gqa=True),
            "lean": lambda: lean_dense(q1, k1, v1, causal=True),
            "fa4": lambda: fa4_dense(q1, k1, v1, causal=True)},
        "prefill b1 s512": {
            "sdpa": lambda: F.scaled_dot_product_attention(*sp, is_causal=True, enable_gqa=True),
            "lean": lambda: lean_dense(qp, kp, vp, causal=True),
            "fa4": lambda: fa4_dense(qp, kp, vp, causal=True)},
        "decode b1 sk512 seqused_k": {
            "lean": lambda: lean_varlen(q1, k1, v1, seqused_k=used, causal=True),
            "fa4": lambda: fa4_varlen(q1, k1, v1, seqused_k=used, causal=True)},
        "decode b1 sk512 paged16": {
            "lean": lambda: lean_varlen(q1, pk, pv, seqused_k=used, page_table=table, causal=True),
            "fa4": lambda: fa4_varlen(q1, pk, pv, seqused_k=used, page_table=table, causal=True)},
    }
    return calls, x


def per_call_us(torch: Any, fn: Any, iters: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def captured(torch: Any, fn: Any, steps: int, errors: dict[str, str], name: str) -> Any:
    """A CUDA graph of `steps` calls of fn (after a warm-up call); None, noted in `errors`, if capture fails."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(steps):
                fn()
        return graph
    except Exception as e:  # noted in the JSON; the other modes still run
        errors[name] = repr(e)[:500]
        torch.cuda.synchronize()
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--build", action="store_true", help="build the calls it runs into the store first")
    parser.add_argument("-j", "--jobs", type=int, default=8)
    args = parser.parse_args()
    if args.build:
        build(args.jobs)
    import torch

    calls, x = callables(torch)
    graphs = {"decode b1 sk512 seqused_k": calls["decode b1 sk512 seqused_k"]["lean"],
              "decode b1 sk512 paged16": calls["decode b1 sk512 paged16"]["lean"],
              "decode b1 sk512": calls["decode b1 sk512"]["lean"]}
    errors: dict[str, str] = {}
    timed = {}
    for c, modes in calls.items():
        for m, fn in modes.items():
            try:  # warm-up: loads, first launches, allocator
                per_call_us(torch, fn, 100)
                timed[(c, m)] = fn
            except Exception as e:  # noted in the JSON; the other modes still run
                errors[f"{c} {m}"] = repr(e)[:500]
    replay = {c: captured(torch, fn, 1, errors, f"{c} graph") for c, fn in graphs.items() if (c, "lean") in timed}
    timed.update({(c, "lean graph replay"): g.replay for c, g in replay.items() if g is not None})
    for fn in timed.values():
        per_call_us(torch, fn, 100)
    gpu = {key: captured(torch, fn, 50, errors, f"{key[0]} {key[1]} x50") for key, fn in timed.items()
           if key[1] in ("sdpa", "lean")}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in timed}
    for _ in range(args.rounds):
        for key, fn in timed.items():
            times[key].append(per_call_us(torch, fn, args.iters))
    gpu_us = {key: per_call_us(torch, graph.replay, 20) / 50 for key, graph in gpu.items() if graph is not None}
    results: dict[str, dict[str, Any]] = {}
    for (call, mode), rounds in times.items():
        results.setdefault(call, {})[mode] = {"median_us": round(statistics.median(rounds), 2),
                                              "min_us": round(min(rounds), 2),
                                              "rounds_us": [round(t, 2) for t in rounds]}
        if (call, mode) in gpu_us:
            results[call][mode]["gpu_us"] = round(gpu_us[(call, mode)], 2)
    ratios = {call: {f"{a}/{b}": round(modes[a]["median_us"] / modes[b]["median_us"], 3)
                     for a, b in (("lean", "sdpa"), ("lean", "fa4"), ("lean graph replay", "lean"))
                     if a in modes and b in modes} for call, modes in results.items()}
    doc = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "python": platform.python_version(), "cpu": _cpu(), "iters": args.iters, "rounds": args.rounds,
           "results": results, "ratios": ratios, "errors": errors,
           "lean_decode_profile": _profile(calls["decode b1 sk512"]["lean"])}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for call, modes in results.items():
        print(call, {m: (r["median_us"], r.get("gpu_us")) for m, r in modes.items()}, ratios[call])


def _profile(fn: Any, calls: int = 2000) -> str:
    """The top of a cProfile of `calls` calls (host path; kernels launch as usual)."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    return text.getvalue()


def _cpu() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


if __name__ == "__main__":
    main()
