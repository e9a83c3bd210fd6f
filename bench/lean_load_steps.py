"""Where a warm lean process's first call of a new training signature spends its host time, step by step, on a
host without a GPU (issue 29: the first call of a new signature at most 2 ms).

What runs without CUDA is all of the first call's host work up to the first launch: the recipe file read, decoded
and checked (store/recipes.py), the region looked up, each kernel's index entry read, its library hashed and mapped
(runtime/libraries.py: tvm_ffi, dlopen), the certification gate (trust/certified.py; without a GPU there is no
device class, so no verdict file is read) and the steps bound (runtime/replay.py). Not measured here: CUDA's
loading of each kernel's cubin (CuTe's exported function loads it at its first call, on the GPU) and the launches.

Each round copies the store (fresh inodes: dlopen maps every library again rather than returning the handle of an
earlier round), starts a Runtime on the copy, warms it with another signature (the runtime library, the store's
first reads), forgets the process's parsed recipe files, then times the new signature's first `bound()` with the
garbage collector off (its collections are reported apart: a full one in a process holding torch costs tens of ms
whenever it falls), then, apart, the backward's first bind (`Bound.backward()`: where a version loads and binds
the backward's kernels at the first backward; 0 for one that did all at the first bound). Forward-only rounds do
the same for the signature's forward-only use (return_lse without grad: the training file's forward part) in a
fresh Runtime, and report which kernel families it loaded. Each step is the inclusive wall and CPU time of the
functions named in STEPS, summed over the call; a step whose function a version does not have reads 0.

    FA4_AOT_SKU=h200 python bench/lean_load_steps.py STORE OUT.json [ROUNDS]

With PYTHONPATH=TREE it measures that tree's fa4_aot (a worktree of an earlier commit: before and after with the
same script); OUT.json names the package measured.

STORE: a store of tests/data/tiny_variants.toml for h200 (its det-bwd training signature and full-fwd warm-up),
built with the toolchain of the python that runs this (its tvm_ffi must load the libraries).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# (step name, module path, owner attribute or "", function name): inclusive times of these functions
STEPS = [
    ("recipe read, decode and check", "fa4_aot.store.recipes", "", "load"),
    # the lean runtime since regions are checked at first use: the file and every guard, then the region selected
    ("recipe read, decode and guard check (load_lazy)", "fa4_aot.store.recipes", "", "load_lazy"),
    ("file decode, whole (recipe_file.decode)", "fa4_aot.domain.recipe_file", "", "decode"),
    ("file decode, regions packed (recipe_file.read)", "fa4_aot.domain.recipe_file", "", "read"),
    ("selected region's check (Stored.region)", "fa4_aot.store.recipes", "Stored", "region"),
    ("selected region's unpack (Packed.document)", "fa4_aot.domain.recipe_file", "Packed", "document"),
    ("index entry reads", "fa4_aot.store", "Store", "get_entry"),
    ("library hash (verified_file)", "fa4_aot.store", "Store", "verified_file"),
    ("library hash and map (_open)", "fa4_aot.runtime.libraries", "Libraries", "_open"),
    ("certification gate (admit)", "fa4_aot.trust.certified", "Gate", "admit"),
    ("bind steps", "fa4_aot.runtime.replay", "", "bind"),
    ("link folder creation (mkdtemp)", "tempfile", "", "mkdtemp"),
    ("link folder removal (rmtree)", "shutil", "", "rmtree"),
    ("folder removal call (os.rmdir; inside rmtree too)", "os", "", "rmdir"),
]
SIZES = {"batch": 1, "seqlen_q": 512, "seqlen_k": 512}


class Timers:
    """Wraps the STEPS functions to add up their inclusive wall and CPU milliseconds while `on`."""

    def __init__(self) -> None:
        import importlib

        self.on = False
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        for name, module, owner, attr in STEPS:
            target: Any = importlib.import_module(module)
            target = getattr(target, owner, None) if owner else target
            if target is not None and hasattr(target, attr):
                setattr(target, attr, self._wrap(name, getattr(target, attr)))

    def _wrap(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[name] = self.wall.get(name, 0.0) + (time.perf_counter() - wall) * 1e3
                self.cpu[name] = self.cpu.get(name, 0.0) + (time.process_time() - cpu) * 1e3

        return timed


def one_round(store: Path, timers: Timers, forward_only: bool = False) -> dict[str, Any]:
    import torch

    from fa4_aot.runtime import runner
    from fa4_aot.runtime.call_args import signature
    from fa4_aot.store import recipes

    device = torch.device("cuda")  # a value bind() keeps; nothing touches CUDA before a launch
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(store, copy, symlinks=True)
        rt = runner.runtime(copy)
        rt.attention(signature("dense", "torch.bfloat16", 16, 64, 16, 64)).bound(SIZES, device, None)
        recipes._parsed.clear()
        flags = {"return_lse": True} if forward_only else {"training": True, "deterministic": True}
        sig = signature("dense", "torch.bfloat16", 16, 128, 16, 128, causal=True, **flags)
        bound, first = _timed(timers, lambda: rt.attention(sig).bound(SIZES, device, None))
        result = {"first_bound": first, "kernels": len(bound.region.kernels),
                  "families_loaded": sorted(rt.libraries._loaded[k.kernel_key].family for k in bound.region.kernels
                                            if k.kernel_key in rt.libraries._loaded)}
        if not forward_only and hasattr(bound, "backward"):  # a version binding the backward at its first call
            result["first_backward_bind"] = _timed(timers, bound.backward)[1]
        runner._runtimes.pop(copy, None)
        return result


def _timed(timers: Timers, call: Any) -> tuple[Any, dict[str, Any]]:
    """(call(), its wall and CPU ms with the collector off, the STEPS inside it, and the full collection after)."""
    timers.wall, timers.cpu = {}, {}
    gc.collect()
    gc.disable()
    timers.on = True
    wall, cpu = time.perf_counter(), time.process_time()
    found = call()
    wall, cpu = (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3
    timers.on = False
    gc.enable()
    full_gc = time.perf_counter()
    gc.collect()
    full_gc = (time.perf_counter() - full_gc) * 1e3
    return found, {"wall_ms": wall, "cpu_ms": cpu, "steps_wall_ms": dict(timers.wall),
                   "steps_cpu_ms": dict(timers.cpu), "full_gc_ms": full_gc}


def _median(runs: list[dict[str, Any]], part: str) -> dict[str, Any] | None:
    """Medians over `runs` of one part (first_bound, first_backward_bind): wall, CPU and each step."""
    found = [r[part] for r in runs if part in r]
    if not found:
        return None

    def median(key: str, name: str | None = None) -> float:
        return round(float(statistics.median(r[key].get(name, 0.0) if name else r[key] for r in found)), 3)

    names = [s[0] for s in STEPS]
    return {"wall_ms": median("wall_ms"), "fastest_wall_ms": round(min(r["wall_ms"] for r in found), 3),
            "cpu_ms": median("cpu_ms"), "full_gc_ms": median("full_gc_ms"),
            "steps_cpu_ms": {n: median("steps_cpu_ms", n) for n in names},
            "steps_wall_ms": {n: median("steps_wall_ms", n) for n in names}}


def main() -> None:
    import fa4_aot

    os.environ.setdefault("FA4_AOT_SKU", "h200")
    store, out = Path(sys.argv[1]), Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    timers = Timers()
    runs = [one_round(store, timers) for _ in range(rounds)]
    forward_only = [one_round(store, timers, forward_only=True) for _ in range(rounds)]
    summary = {"first_bound": _median(runs, "first_bound"), "first_backward_bind": _median(runs, "first_backward_bind"),
               "forward_only_first_bound": _median(forward_only, "first_bound"),
               "families_loaded": {"training first bound": runs[0]["families_loaded"],
                                   "forward-only first bound": forward_only[0]["families_loaded"]}}
    doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
           f"{platform.python_version()}", "fa4_aot": str(Path(fa4_aot.__file__).parent), "store": str(store),
           "rounds": rounds, "kernels": runs[0]["kernels"], "median": summary, "runs": runs,
           "forward_only_runs": forward_only}
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
