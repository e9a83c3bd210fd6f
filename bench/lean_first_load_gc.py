"""The garbage collector's pauses inside a warm lean process's first load of a new signature, on a host without a
GPU: how often a full collection lands inside it, and what it costs there.

A process holding many objects (torch imported, plus HEAP small containers standing for a model and its caller's
state: the H200 host's full collections took 85-99 ms in a process holding torch) runs ROUNDS rounds; each copies
the store (fresh inodes), starts a Runtime, warms it with another signature, forgets the parsed recipe files, then
times, with the collector on as a user runs it, the new signature's recipe read and first `bound()` (first forward)
and its first backward's bind (`Bound.backward()`, where the version has it). Each part reports its wall ms and
the collector's pauses inside it, full collections (generation 2) apart.

    FA4_AOT_SKU=h200 python bench/lean_first_load_gc.py STORE OUT.json [ROUNDS] [HEAP] [GROW] [DUE]

Between rounds the "caller" keeps GROW more small containers (default 20,000), as a process's state grows between
its new signatures: what makes the collector's full collections come at all, somewhere in the process. Where one
falls is chance (a first load allocates a small share of the process's objects); DUE=1 (default 0) makes it
due before each timed part, as it is in the unlucky call: eleven `gc.collect(1)` then eleven `gc.collect(0)` raise
the older generations' counts past their thresholds, so the next automatic collection (after 700 allocations) is a
full one whenever the objects kept since the last full collection pass a quarter of the heap (CPython's rule).

With PYTHONPATH=TREE it measures that tree's fa4_aot (before and after with the same script). STORE: a store of
tests/data/tiny_variants.toml for h200 (the det-bwd training signature and the full-fwd warm-up), built with the
toolchain of the python that runs this.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {"batch": 1, "seqlen_q": 512, "seqlen_k": 512}
PAUSES: list[tuple[int, float]] = []


def _gc_pause(phase: str, info: dict[str, Any], started: list[float] = [0.0]) -> None:  # noqa: B006
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        PAUSES.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))


def _timed(call: Any) -> tuple[Any, dict[str, Any]]:
    PAUSES.clear()
    started = time.perf_counter()
    found = call()
    wall = (time.perf_counter() - started) * 1e3
    full = [ms for g, ms in PAUSES if g == 2]
    return found, {"wall_ms": wall, "gc_ms": sum(ms for _g, ms in PAUSES), "full_gc_ms": sum(full),
                   "full_gcs": len(full)}


def _due() -> None:
    for _ in range(11):  # generation 2's count past its threshold (10)
        gc.collect(1)
    for _ in range(11):  # then generation 1's: the next automatic collection looks at generation 2 first
        gc.collect(0)


def one_round(store: Path, due: bool) -> dict[str, Any]:
    from fa4_aot.runtime import runner
    from fa4_aot.runtime.call_args import signature
    from fa4_aot.store import recipes

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(store, copy, symlinks=True)
        rt = runner.runtime(copy)
        rt.attention(signature("dense", "torch.bfloat16", 16, 64, 16, 64)).bound(SIZES, "cuda", None)
        recipes._parsed.clear()
        sig = signature("dense", "torch.bfloat16", 16, 128, 16, 128, causal=True, training=True, deterministic=True)
        if due:
            _due()
        bound, first = _timed(lambda: rt.attention(sig).bound(SIZES, "cuda", None))
        if due:
            _due()
        _, backward = _timed(bound.backward)
        runner._runtimes.pop(copy, None)
        return {"first_forward": first, "first_backward": backward}


def _summary(rounds: list[dict[str, Any]], part: str) -> dict[str, Any]:
    found = [r[part] for r in rounds]
    return {"wall_ms_median": round(statistics.median(f["wall_ms"] for f in found), 3),
            "wall_ms_max": round(max(f["wall_ms"] for f in found), 3),
            "gc_ms_total": round(sum(f["gc_ms"] for f in found), 3),
            "full_gcs": sum(f["full_gcs"] for f in found),
            "full_gc_ms_max": round(max(f["full_gc_ms"] for f in found), 3)}


def main() -> None:
    import torch  # noqa: F401  (the objects of a process holding torch)

    import fa4_aot

    os.environ.setdefault("FA4_AOT_SKU", "h200")
    store, out = Path(sys.argv[1]), Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    heap = [{"i": [i]} for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1_000_000)]
    gc.collect()
    gc.callbacks.append(_gc_pause)
    grow = int(sys.argv[5]) if len(sys.argv) > 5 else 20_000
    due = len(sys.argv) > 6 and sys.argv[6] == "1"
    caller: list[Any] = []
    runs = []
    for _ in range(rounds):
        caller.append([{"j": [j]} for j in range(grow)])  # the caller's state grows between first calls
        runs.append(one_round(store, due))
    summary = {part: _summary(runs, part) for part in ("first_forward", "first_backward")}
    doc = {"date": time.strftime("%Y-%m-%d"), "fa4_aot": str(Path(fa4_aot.__file__).parent), "rounds": rounds,
           "heap_objects": len(gc.get_objects()), "held": len(heap), "grow": grow, "due": due, "summary": summary,
           "runs": runs}
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
