"""What a warm lean process pays for the first call of a signature it has not run yet (issue 29: at most 2 ms).

One process, after a warm-up call of another signature (torch's CUDA init, the runtime libraries, the store's
index): for each new signature, forward and backward timed on the first call and on the second, each to the end of
its GPU work. The first call's extra cost (first minus second) is what a new signature costs: reading and checking
its recipe file, loading its kernels' libraries, binding. Signatures: causal training at GQA ratios 1 to 8 over 8
KV heads, head dims 64 and 128 (the default build's gqa-sweep-train-prefill), so that each is a recipe file the
process has not read.

    FA4_AOT_CACHE=<a store of the default h200 build> python bench/lean_new_signature.py OUT.json [lean|fa4]

`fa4`: the same calls through FA4's own flash_attn_func over fa4_aot.install() (what the lean runtime replaces).
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def timed(fn):  # type: ignore[no-untyped-def]
    import torch
    torch.cuda.synchronize()
    started = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - started) * 1e3


def as_pair(result):  # type: ignore[no-untyped-def]
    return result if isinstance(result, tuple) else (result, None)


def main() -> None:
    import torch

    import fa4_aot

    runtime = sys.argv[2] if len(sys.argv) > 2 else "lean"
    if runtime == "fa4":
        fa4_aot.install()
        from flash_attn.cute import flash_attn_func
    else:
        flash_attn_func = fa4_aot.flash_attn_func

    def step(heads: int, heads_kv: int, dim: int):  # type: ignore[no-untyped-def]
        q = torch.randn(2, 2048, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(2, 2048, heads_kv, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        (out, _), fwd = timed(lambda: as_pair(flash_attn_func(q, k, v, causal=True)))
        _, bwd = timed(lambda: out.float().sum().backward())
        return fwd, bwd

    step(16, 16, 96)  # warm-up on a signature outside the list below (train-wide-heads' head dim 96)
    rows = []
    for dim in (64, 128):
        for ratio in range(1, 9):
            first = step(8 * ratio, 8, dim)
            second = step(8 * ratio, 8, dim)
            rows.append({"dim": dim, "heads": 8 * ratio, "heads_kv": 8,
                         "first_fwd_ms": round(first[0], 3), "second_fwd_ms": round(second[0], 3),
                         "first_bwd_ms": round(first[1], 3), "second_bwd_ms": round(second[1], 3),
                         "new_fwd_ms": round(first[0] - second[0], 3), "new_bwd_ms": round(first[1] - second[1], 3)})
            print(rows[-1], flush=True)
    summary = {f"{k}_median": statistics.median(r[k] for r in rows) for k in ("new_fwd_ms", "new_bwd_ms")}
    summary |= {f"{k}_max": max(r[k] for r in rows) for k in ("new_fwd_ms", "new_bwd_ms")}
    doc = {"date": time.strftime("%Y-%m-%d"), "runtime": runtime, "device": torch.cuda.get_device_name(),
           "rows": rows, **summary}
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
