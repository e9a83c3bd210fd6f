"""Shape-complete planning on this machine: seconds and kernels per signature class, for h200 and b200.

    python bench/plan_coverage.py [--shapes N] [--seed S] [--out FILE]

Plans each signature class of tests/fa4/test_complete.py (fa4.plan_signature, uncached: one
fresh process per SKU) and checks N random shapes per class against the plan, as the test does (N = 0: plan
only). Both SKUs run at once, one process each. Also records the process CPU seconds, since wall time on a
shared 2-core machine depends on what else runs (the load average is recorded too). Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fa4.test_complete import B200, CLASSES, H200, _init, check  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    pools = {sku.name: ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_init, initargs=(sku,))
             for sku in (H200, B200)}
    futures = {sku.name: [pools[sku.name].submit(check, (sku, i, args.seed, args.shapes))
                          for i in range(len(CLASSES))] for sku in (H200, B200)}
    results = {name: [f.result() for f in fs] for name, fs in futures.items()}
    for pool in pools.values():
        pool.shutdown()
    wall = time.perf_counter() - started
    rows = []
    for i, signature in enumerate(CLASSES):
        label = signature.call(0, 0, 0).describe().replace(" b=0 sq=0 sk=0", "")
        row = {"class": label}
        for name in ("h200", "b200"):
            r = results[name][i]
            row[name] = ({"unsupported": r["unsupported"]} if "unsupported" in r else
                         {"kernels": r["kernels"], "plan_seconds": round(r["plan_seconds"], 2),
                          "outside": len(r["outside"]), "seconds": round(r["seconds"], 1),
                          "cpu_seconds": round(r["cpu_seconds"], 1)})
        rows.append(row)
        print(f"{label:<75} " + "  ".join(
            f"{n}: {row[n].get('kernels', '-')} kernels {row[n].get('plan_seconds', '-')}s" for n in ("h200", "b200")))
    doc = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "python": platform.python_version(),
           "shapes_per_class": args.shapes, "seed": args.seed, "wall_seconds": round(wall, 1),
           "load_average_before": load_before, "load_average_after": os.getloadavg(), "classes": rows}
    cpu = sum(row[n].get("cpu_seconds", 0) for row in rows for n in ("h200", "b200"))
    doc["cpu_seconds"] = round(cpu, 1)
    print(f"wall {wall:.1f}s, worker CPU {cpu:.1f}s, "
          f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
