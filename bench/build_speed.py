"""Build throughput on this machine: kernels per minute at 1 and 2 jobs, and a no-op rebuild, side by side.

    python bench/build_speed.py --sku h200 [--subset train-fp16 --subset train-deterministic] [--out FILE]

(b) the same subset of variants is built into fresh stores with 1 and with 2 jobs;
(c) the whole default matrix is built into a fresh store with 2 jobs, then built again (no-op).
Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from fa4_aot import config
from fa4_aot.compile import orchestrator
from fa4_aot.matrix import variants
from fa4_aot.store import Store


def timed_build(matrix: variants.Matrix, sku: str, store: Store, names: list[str] | None, jobs: int) -> dict:
    started = time.perf_counter()
    report = orchestrator.build(matrix, matrix.sku(sku), store, matrix.select(names), jobs=jobs)
    seconds = time.perf_counter() - started
    assert report.failed == 0, report.to_dict()["failures"][:3]
    return {"jobs": jobs, "built": report.count("built"), "present": report.count("present"), "seconds": seconds,
            "kernels_per_min": report.count("built") / seconds * 60 if report.count("built") else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sku", default="h200")
    parser.add_argument("--subset", action="append", default=None)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    subset = args.subset or ["train-fp16", "train-deterministic"]
    matrix = variants.load(config.default_variants_file())
    with tempfile.TemporaryDirectory() as tmp:
        one = timed_build(matrix, args.sku, Store(Path(tmp) / "j1"), subset, jobs=1)
        two = timed_build(matrix, args.sku, Store(Path(tmp) / "j2"), subset, jobs=2)
        full = timed_build(matrix, args.sku, Store(Path(tmp) / "full"), None, jobs=2)
        noop = timed_build(matrix, args.sku, Store(Path(tmp) / "full"), None, jobs=2)
    rows = [
        (f"subset {'+'.join(subset)}, 1 job", one),
        (f"subset {'+'.join(subset)}, 2 jobs", two),
        ("default matrix, 2 jobs, empty store", full),
        ("default matrix, 2 jobs, no-op rebuild", noop),
    ]
    print(f"{'build (' + args.sku + ')':<58}{'built':>7}{'present':>9}{'seconds':>9}{'kernels/min':>13}")
    for name, r in rows:
        print(f"{name:<58}{r['built']:>7}{r['present']:>9}{r['seconds']:>9.1f}{r['kernels_per_min']:>13.1f}")
    print(f"2 jobs vs 1 job: {two['kernels_per_min'] / one['kernels_per_min']:.2f}x kernels/min; "
          f"no-op rebuild / full build: {noop['seconds'] / full['seconds']:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"sku": args.sku, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
               "one_job": one, "two_jobs": two, "full": full, "noop": noop}
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
