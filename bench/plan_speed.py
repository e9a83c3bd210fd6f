"""Planning speed (issue 30, point 9): work items planned per second, as `fa4-aot build --dry-run` plans them
(worker.plan_calls, record=False: FA4's dispatch on fake tensors, no compile), for one model's work items on a SKU.
Each tree given (this one, and with --before another checkout, e.g. a `git worktree` of an older commit) plans
the same items in a fresh interpreter after FA4's import (not timed), in turns, `--rounds` times each; the table
shows items per wall and per CPU second side by side (the ratio by CPU seconds: a shared host's wall clock
measures the others' load too) and checks that every tree planned the same kernel keys.

    /work/main/.venv/bin/python bench/plan_speed.py --model sample:30 --before /tmp/old-checkout \\
        [--sku h200] [--workload train,prefill,decode] [--tp 1,8] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# runs in the tree measured (its fa4_aot first on sys.path): plans the items, prints one JSON line
MEASURE = r"""
import hashlib, json, sys, time
from fa4_aot import config
from fa4_aot.compile import orchestrator, worker
from fa4_aot.matrix import models, modelwork, variants
matrix = variants.load(config.default_variants_file())
sku = matrix.sku(sys.argv[1])
if sys.argv[2].startswith("sample:"):  # N items strided over the whole matrix, as `build --sku S --dry-run` plans
    work, n = orchestrator.work_of(matrix, sku), int(sys.argv[2].split(":")[1])
    items = work[::max(1, len(work) // n)][:n]
else:
    tps, workloads = tuple(int(t) for t in sys.argv[3].split(",")), tuple(sys.argv[4].split(","))
    items = [(i.label, i.signature) for i in modelwork.items(models.resolve(sys.argv[2]), tps, workloads)]
worker.plan_calls(sku, [("warm", items[0][1].call(1, 128, 128) if hasattr(items[0][1], "call") else items[0][1])],
                  None, record=False)  # FA4's import: not timed
started, cpu = time.perf_counter(), time.process_time()
out = worker.plan_calls(sku, items, None, record=False)
seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
keys = sorted({k.kernel_key for k in out.kernels})
print(json.dumps({"items": len(items), "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
                  "per_second": round(len(items) / seconds, 3), "per_cpu_second": round(len(items) / cpu, 3),
                  "kernels": len(keys), "rejected": len(out.rejected),
                  "keys_sha256": hashlib.sha256("\n".join(keys).encode()).hexdigest()}))
"""


def measure(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", MEASURE, args.sku, args.model, args.tp, args.workload],
                          capture_output=True, text=True, cwd=tree, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"planning in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _best(rows: list[dict[str, Any]], tree: str) -> float:
    return max(float(row["per_cpu_second"]) for row in rows if row["tree"] == tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b",
                        help="a catalog model, or sample:N for N work items strided over the SKU's whole matrix")
    parser.add_argument("--sku", default="h200")
    parser.add_argument("--tp", default="1")
    parser.add_argument("--workload", default="train,prefill,decode")
    parser.add_argument("--before", type=Path, help="another checkout to measure in turn with this one")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    trees = {"before": args.before, "after": ROOT} if args.before else {"this tree": ROOT}
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for name, tree in trees.items():
            row = {"tree": name, "round": r + 1, "load1": round(os.getloadavg()[0], 1), **measure(tree, args)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    digests = {row["keys_sha256"] for row in rows}
    print(f"{args.model} on {args.sku}, TP {args.tp}, {args.workload}: {rows[0]['items']} work items, "
          f"{rows[0]['kernels']} kernels, {'the same' if len(digests) == 1 else 'DIFFERENT'} kernel keys in every run")
    for name in trees:
        mine = [row for row in rows if row["tree"] == name]
        print(f"  {name:10} items per wall second: {', '.join(str(row['per_second']) for row in mine)}; per CPU "
              f"second: {', '.join(str(row['per_cpu_second']) for row in mine)}; load average "
              f"{', '.join(str(row['load1']) for row in mine)}")
    if args.before:  # CPU seconds: the wall clock of a host shared with other builds measures their load too
        ratio = _best(rows, "after") / _best(rows, "before")
        print(f"  after/before, items per CPU second (best of each): {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                         "host": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows},
                                        indent=1))
    if len(digests) != 1:
        raise SystemExit("the trees planned different kernel keys")


if __name__ == "__main__":
    main()
