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
whenever it falls). Each step is the inclusive wall and CPU time of the functions named in STEPS, summed over the
call; a step whose function a version does not have reads 0.

    FA4_AOT_SKU=h200 python bench/lean_load_steps.py STORE OUT.json [ROUNDS]

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
    ("selected region's check (Stored.region)", "fa4_aot.store.recipes", "Stored", "region"),
    ("index entry reads", "fa4_aot.store", "Store", "get_entry"),
    ("library hash (verified_file)", "fa4_aot.store", "Store", "verified_file"),
    ("library hash and map (_open)", "fa4_aot.runtime.libraries", "Libraries", "_open"),
    ("certification gate (admit)", "fa4_aot.trust.certified", "Gate", "admit"),
    ("bind steps", "fa4_aot.runtime.replay", "", "bind"),
    ("link folder creation (mkdtemp)", "tempfile", "", "mkdtemp"),
    ("link folder removal (rmtree)", "shutil", "", "rmtree"),
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


def one_round(store: Path, timers: Timers) -> dict[str, Any]:
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
        sig = signature("dense", "torch.bfloat16", 16, 128, 16, 128, causal=True, training=True, deterministic=True)
        timers.wall, timers.cpu = {}, {}
        gc.collect()
        gc.disable()
        timers.on = True
        wall, cpu = time.perf_counter(), time.process_time()
        bound = rt.attention(sig).bound(SIZES, device, None)
        wall, cpu = (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3
        timers.on = False
        gc.enable()
        full_gc = time.perf_counter()
        gc.collect()
        full_gc = (time.perf_counter() - full_gc) * 1e3
        runner._runtimes.pop(copy, None)
        return {"first_bound_wall_ms": wall, "first_bound_cpu_ms": cpu, "kernels": len(bound.region.kernels),
                "steps_wall_ms": dict(timers.wall), "steps_cpu_ms": dict(timers.cpu), "full_gc_ms": full_gc}


def main() -> None:
    os.environ.setdefault("FA4_AOT_SKU", "h200")
    store, out = Path(sys.argv[1]), Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    timers = Timers()
    runs = [one_round(store, timers) for _ in range(rounds)]
    names = [s[0] for s in STEPS]

    def median(key: str, name: str | None = None) -> float:
        return round(float(statistics.median(r[key].get(name, 0.0) if name else r[key] for r in runs)), 3)

    summary = {"first_bound_wall_ms": median("first_bound_wall_ms"), "first_bound_cpu_ms": median("first_bound_cpu_ms"),
               "full_gc_ms": median("full_gc_ms"),
               "steps_cpu_ms": {n: median("steps_cpu_ms", n) for n in names},
               "steps_wall_ms": {n: median("steps_wall_ms", n) for n in names}}
    doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
           f"{platform.python_version()}", "store": str(store), "rounds": rounds, "kernels": runs[0]["kernels"],
           "median": summary, "runs": runs}
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
