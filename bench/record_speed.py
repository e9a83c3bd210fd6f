"""Planning WITH recording (issue 29, part 3): CPU seconds per work item of the planning `fa4-aot build` does
(orchestrator._plan, record=True: FA4's dispatch on fake tensors and every item's signatures explored for the lean
runtime's recipe regions), in each tree given, over the same items, into a fresh store each; then the two stores
compared: the same kernel keys, the same recipe files, and every point of each file's signatures' size space
that the before store's regions cover covered by the after store's too (and the reverse, reported).

Items: whole groups of items sharing recipe keys (plan_tasks.by_shared_keys), strided over the SKU's matrix, up
to --items. CPU seconds are the driver's and its worker processes' (RUSAGE_CHILDREN after the pool is shut down),
FA4's import included, as a build pays it.

    /work/main/.venv/bin/python bench/record_speed.py --before /tmp/old-checkout --items 24 --jobs 4 [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import hashlib, json, resource, sys, time
from pathlib import Path
from fa4_aot import config
from fa4_aot.compile import orchestrator
from fa4_aot.compile.executors import LocalExecutor
from fa4_aot.matrix import variants
from fa4_aot.store import Store
matrix = variants.load(config.default_variants_file())
sku = matrix.sku(sys.argv[1])
work = orchestrator.work_of(matrix, sku)
work = [work[i] for i in json.loads(sys.argv[2])]
store, jobs = Store(Path(sys.argv[3])), int(sys.argv[4])
report = orchestrator.Report(sku=sku.name)
started, cpu = time.perf_counter(), time.process_time()
ex = LocalExecutor(jobs)
try:
    planned = orchestrator._plan(ex, sku, store, work, report, False)
finally:
    ex.close()
child = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = time.process_time() - cpu + child.ru_utime + child.ru_stime
keys = sorted(k.kernel_key for k in planned)
print(json.dumps({"items": len(work), "wall_seconds": round(time.perf_counter() - started, 1),
                  "cpu_seconds": round(cpu, 1), "cpu_per_item": round(cpu / len(work), 2),
                  "kernels": len(keys), "regions_recorded": report.recipes, "lean_failures": len(report.lean_failures),
                  "keys_sha256": hashlib.sha256("\n".join(keys).encode()).hexdigest()}))
"""

COMPARE = r"""
import json, sys
from pathlib import Path
import numpy as np
from fa4_aot.domain import recipe_space, symexpr
from fa4_aot.domain.recipe_format import bound_sizes
from fa4_aot.domain.signature import Signature
from fa4_aot.matrix import variants
from fa4_aot import config
from fa4_aot.store import Store, recipes
sku = variants.load(config.default_variants_file()).sku(sys.argv[1])
a, b = Store(Path(sys.argv[2])), Store(Path(sys.argv[3]))
def files(s):
    return sorted(p.name.split(".")[0] for p in (s.root / "recipes").rglob("*") if p.is_file())
def first(judge, regions):
    found = np.full(judge.count, -1)
    for n, r in reversed(list(enumerate(regions))):
        found = np.where(judge.covered(r.guards), n, found)
    return found
def recipe(region, at):
    # the recipe's steps, tensors, kernels and outputs with every size expression evaluated at `at` (a region
    # general in batch and one pinned to batch 1 write `batch` and `1`), guards, recorded_at and signature aside
    sizes = {**bound_sizes(Signature.from_dict(region.signature)), **at}
    def value(x):
        if isinstance(x, dict):
            return symexpr.evaluate(x["e"], sizes) if set(x) == {"e"} else {k: value(v) for k, v in x.items()}
        return [value(y) for y in x] if isinstance(x, list) else x
    doc = region.to_json()
    return json.dumps(value({k: v for k, v in doc.items() if k not in ("guards", "recorded_at", "signature")}),
                      sort_keys=True)
fa, fb = files(a), files(b)
out = {"files_before": len(fa), "files_after": len(fb), "same_files": fa == fb, "regions_before": 0,
       "regions_after": 0, "points": 0, "covered_before": 0, "covered_after": 0, "before_not_after": 0,
       "after_not_before": 0, "same_region_sets": 0,
       "same_recipe_at_point": 0, "other_recipe_at_point": 0}
for key in fa:
    ra, rb = recipes.load(a, key), recipes.load(b, key)
    out["regions_before"] += len(ra); out["regions_after"] += len(rb)
    ga = {json.dumps(r.guards, sort_keys=True) for r in ra}; gb = {json.dumps(r.guards, sort_keys=True) for r in rb}
    out["same_region_sets"] += ga == gb
    sigs = sorted({json.dumps(r.signature, sort_keys=True) for r in ra + rb})
    for n, sig in enumerate(Signature.from_dict(json.loads(d)) for d in sigs):
        sp = recipe_space.space(sig, sku)
        rng = np.random.default_rng(n)
        pts = recipe_space.pinned(recipe_space.draw(sp, rng, 20000), sig)
        judge = recipe_space.Judge(pts)
        ca, cb = judge.any_covers([r.guards for r in ra]), judge.any_covers([r.guards for r in rb])
        out["points"] += len(ca); out["covered_before"] += int(ca.sum()); out["covered_after"] += int(cb.sum())
        out["before_not_after"] += int((ca & ~cb).sum()); out["after_not_before"] += int((cb & ~ca).sum())
        # where both cover a point: the same recipe (steps, kernels, outputs), guards and recorded_at aside
        first_a, first_b = first(judge, ra), first(judge, rb)
        for i in np.flatnonzero(ca & cb)[:500]:
            at = recipe_space.point(pts, int(i))
            same = recipe(ra[first_a[i]], at) == recipe(rb[first_b[i]], at)
            out["same_recipe_at_point"] += same; out["other_recipe_at_point"] += not same
print(json.dumps(out))
"""


def _run(tree: Path, code: str, *argv: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tree, env=env,
                          timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def sample(sku_name: str, count: int) -> list[int]:
    """Indices into the SKU's matrix: whole groups of items sharing recipe keys, strided, up to `count` items."""
    sys.path.insert(0, str(ROOT))
    from fa4_aot import config
    from fa4_aot.compile import lean, orchestrator, plan_tasks
    from fa4_aot.matrix import variants

    matrix = variants.load(config.default_variants_file())
    sku = matrix.sku(sku_name)
    work = orchestrator.work_of(matrix, sku)
    groups = [g for g in plan_tasks.by_shared_keys(list(orchestrator._same_items(work)),
                                                   lambda i: lean.recipe_keys(work[i][1], sku)) if len(g) <= 8]
    picked: list[int] = []
    for g in groups[::max(1, len(groups) // 12)]:
        if len(picked) + len(g) <= count:
            picked += g
    return sorted(picked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="another checkout, planned first")
    parser.add_argument("--sku", default="h200")
    parser.add_argument("--items", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    picked = json.dumps(sample(args.sku, args.items))
    rows: dict[str, Any] = {}
    stores = {name: tempfile.mkdtemp(prefix=f"record-speed-{name}-") for name in ("before", "after")}
    for name, tree in (("before", args.before), ("after", ROOT)):
        rows[name] = {"load1": round(os.getloadavg()[0], 1),
                      **_run(tree, MEASURE, args.sku, picked, stores[name], str(args.jobs))}
        print(name, json.dumps(rows[name]), file=sys.stderr)
    rows["compare"] = _run(ROOT, COMPARE, args.sku, stores["before"], stores["after"])
    rows["same_kernel_keys"] = rows["before"]["keys_sha256"] == rows["after"]["keys_sha256"]
    rows["ratio_items_per_cpu_second"] = round(rows["before"]["cpu_seconds"] / rows["after"]["cpu_seconds"], 2)
    print(json.dumps(rows, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                         "host": os.uname().nodename, "cpus": os.cpu_count(), "jobs": args.jobs,
                                         "items": json.loads(picked), "stores": stores, **rows}, indent=1))


if __name__ == "__main__":
    main()
