"""What a warm lean process pays for the first call of a signature it has not run yet (issue 29: at most 2 ms).

One process, after a warm-up call of another signature (torch's CUDA init, the runtime libraries, the store's
index): for each new signature, forward and backward timed on the first call and on the second, each to the end of
its GPU work. The first call's extra cost (first minus second) is what a new signature costs: reading and checking
its recipe file, loading its kernels' libraries, binding. Signatures: causal training at GQA ratios 1 to 8 over 8
KV heads, head dims 64 and 128 (the default build's gqa-sweep-train-prefill), so that each is a recipe file the
process has not read.

    FA4_AOT_CACHE=<a store of the default h200 build> python bench/lean_new_signature.py OUT.json [lean|fa4]
        [--profile]

`fa4`: the same calls through FA4's own flash_attn_func over fa4_aot.install() (what the lean runtime replaces).
Each row also gives the garbage collector's pauses inside the first forward (`first_fwd_gc_ms`: a full collection
in a process holding torch takes tens of ms, wherever it falls). `--profile`: instead of the rows, one new
signature's first forward and backward under cProfile (the top functions by cumulative and by own time, in OUT and
printed), then its second call likewise, to name where the first call's extra time goes.
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import pstats
import statistics
import sys
import time
from typing import Any

PAUSES: list[float] = []  # the garbage collector's pauses (ms) since the list was last cleared


def _gc_pause(phase: str, _info: dict[str, Any], started: list[float] = [0.0]) -> None:  # noqa: B006
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        PAUSES.append((time.perf_counter() - started[0]) * 1e3)


def profiled(fn: Any, top: int = 40) -> tuple[Any, dict[str, str]]:
    """fn() under cProfile: (its result, the top functions by cumulative and by own time)."""
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    tables = {}
    for order in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(top)
        tables[order] = buf.getvalue()
    return result, tables


def timed(fn: Any) -> tuple[Any, float]:
    import torch
    torch.cuda.synchronize()
    started = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - started) * 1e3


def as_pair(result: Any) -> tuple[Any, Any]:
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
        PAUSES.clear()
        (out, _), fwd = timed(lambda: as_pair(flash_attn_func(q, k, v, causal=True)))
        pauses = sum(PAUSES)
        _, bwd = timed(lambda: out.float().sum().backward())
        return fwd, bwd, pauses

    gc.callbacks.append(_gc_pause)
    step(16, 16, 96)  # warm-up on a signature outside the list below (train-wide-heads' head dim 96)
    if "--profile" in sys.argv:
        first, first_tables = profiled(lambda: step(32, 8, 128))
        second, second_tables = profiled(lambda: step(32, 8, 128))
        doc = {"date": time.strftime("%Y-%m-%d"), "runtime": runtime, "device": torch.cuda.get_device_name(),
               "signature": "causal training, bf16, b=2, s=2048, heads 32/8, head dim 128",
               "first_ms_profiled": first, "second_ms_profiled": second,
               "first_call": first_tables, "second_call": second_tables}
        with open(sys.argv[1], "w") as f:
            json.dump(doc, f, indent=1)
        print(first_tables["cumulative"], first_tables["tottime"], sep="\n")
        return
    rows = []
    for dim in (64, 128):
        for ratio in range(1, 9):
            first = step(8 * ratio, 8, dim)
            second = step(8 * ratio, 8, dim)
            rows.append({"dim": dim, "heads": 8 * ratio, "heads_kv": 8,
                         "first_fwd_ms": round(first[0], 3), "second_fwd_ms": round(second[0], 3),
                         "first_bwd_ms": round(first[1], 3), "second_bwd_ms": round(second[1], 3),
                         "new_fwd_ms": round(first[0] - second[0], 3), "new_bwd_ms": round(first[1] - second[1], 3),
                         "first_fwd_gc_ms": round(first[2], 3)})
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
