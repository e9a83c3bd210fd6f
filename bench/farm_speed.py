"""The Ray executor against the local one on the same cores: kernels per minute, per-task overhead, planning time
for 30,000 calls, and a projection to 256 workers from the measured per-kernel times.

    python bench/farm_speed.py [--sku h200] [--jobs 2] [--rounds 1] [--plan-calls 30000] [--out FILE]

(a) the default matrix for --sku is built into fresh stores by the local executor (--jobs processes) and by Ray
    (a local Ray instance of --jobs CPUs), alternating, each run timed from the call to the report;
(b) Ray's per-task overhead: 400 empty tasks under one SKU's runtime_env on warm workers;
(c) planning only (a dry run) of --plan-calls calls, by each executor;
(d) 256 workers, projected: the measured compile CPU-seconds per kernel and planning seconds per call, divided
    over 256 workers, plus the measured per-task overhead and worker start-up.
Needs no GPU; Ray from the farm extra.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's fa4_aot, not an installed one

from proctree import tree_cpu  # noqa: E402

from fa4_aot import config  # noqa: E402
from fa4_aot.compile import orchestrator  # noqa: E402
from fa4_aot.compile.executors import LocalExecutor  # noqa: E402
from fa4_aot.compile.farm import RayExecutor  # noqa: E402
from fa4_aot.domain.calls import Call  # noqa: E402
from fa4_aot.matrix import variants  # noqa: E402
from fa4_aot.store import Store  # noqa: E402


class TreeCpu:
    """CPU seconds used by this process's descendants (pool workers; Ray's gcs_server, raylet and workers) while
    the block runs, sampled from /proc every 0.2 s, less what each had used before it (a cluster started before
    the timing): on a machine shared with other work, CPU time is the fair measure of what an executor costs,
    wall time alone is not. `by_role` splits it: compiling workers, Ray's daemons, the rest."""

    def __enter__(self) -> TreeCpu:
        import threading

        self.before = tree_cpu(os.getpid())
        self.seen: dict[int, float] = {}
        self.role: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, cpu in self.seen.items():
            out[self.role[pid]] = round(out.get(self.role[pid], 0.0) + cpu, 1)
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for pid, cpu in tree_cpu(os.getpid()).items():
                self.seen[pid] = max(cpu - self.before.get(pid, 0.0), self.seen.get(pid, 0.0))
                if pid not in self.role:
                    self.role[pid] = _role(pid)


def _role(pid: int) -> str:
    """"workers" (a pool's or Ray's worker processes), "ray" (Ray's daemons) or "other" (a linker, a shell)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if cmd.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")):
        return "ray"
    if "multiprocessing" in cmd or "default_worker.py" in cmd or cmd.startswith("ray::"):
        return "workers"
    return "ray" if "/ray/" in cmd or "raylet" in cmd or "gcs_server" in cmd else "other"


def executor(kind: str, jobs: int) -> Any:
    return LocalExecutor(jobs) if kind == "local" else RayExecutor(num_cpus=jobs)


def timed_build(kind: str, jobs: int, sku: Any, work: list[tuple[str, Call]], dry_run: bool = False,
                started_cluster: bool = False) -> dict:
    """One build, timed. With `started_cluster`, Ray's instance is up before the timing starts, as a farm's
    long-lived cluster is (its workers for the SKU still start inside, as the local pool's do)."""
    store = Store(Path(tempfile.mkdtemp(prefix=f"fa4-aot-farm-{kind}-")))
    ready = executor(kind, jobs) if started_cluster else None
    started, cpu0 = time.perf_counter(), time.process_time()
    with TreeCpu() as tree:
        ex = ready or executor(kind, jobs)  # else inside the timing: starting Ray (or the pool) is part of a build
        try:
            report = orchestrator.build_calls(sku, store, work, executor=ex, dry_run=dry_run)
        finally:
            ex.close()
    seconds, cpu_seconds = time.perf_counter() - started, tree.seconds + time.process_time() - cpu0
    assert report.failed == 0, report.to_dict()["failures"][:3]
    built = report.count("planned" if dry_run else "built")
    cpu = [e.compile_seconds for e in store.entries()]
    return {"executor": kind, "jobs": jobs, "calls": len(work), "kernels": built, "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu_seconds, 1), "cpu_by_role": {**tree.by_role(), "driver": round(
                time.process_time() - cpu0, 1)}, "store": str(store.root),
            "kernels_per_min": round(built / seconds * 60, 1) if built and not dry_run else None,
            "kernels_per_cpu_min": round(built / cpu_seconds * 60, 1) if built and not dry_run else None,
            "compile_seconds_sum": round(sum(cpu), 1), "compile_seconds_median": round(statistics.median(cpu), 2)
            if cpu else None, "keys": sorted(r.kernel_key for r in report.results)}


def task_overhead(jobs: int, sku: Any, tasks: int = 400) -> dict:
    """Seconds per empty task on warm workers of one SKU's runtime_env: Ray's own cost of a task."""
    import ray

    ex = RayExecutor(num_cpus=jobs)
    try:
        noop = ray.remote(lambda: None).options(num_cpus=1, runtime_env=ex._env(sku))
        ray.get([noop.remote() for _ in range(jobs * 2)])  # start the workers
        started = time.perf_counter()
        ray.get([noop.remote() for _ in range(tasks)])
        seconds = time.perf_counter() - started
    finally:
        ex.close()
    return {"tasks": tasks, "seconds": round(seconds, 3), "per_task_ms": round(seconds / tasks * 1000, 2),
            "per_task_cpu_ms": round(seconds / tasks * 1000 * jobs, 2)}


def many_calls(matrix: variants.Matrix, sku: Any, count: int) -> list[tuple[str, Call]]:
    """`count` distinct calls: the matrix's variants over wider shape grids (more batches, lengths, heads)."""
    import dataclasses

    out: dict[tuple[str, Call], None] = {}
    for scale in range(1, 64):
        for v in matrix.variants:
            if not v.applies_to(sku) or not getattr(v, "shapes", None):  # model and shape-complete variants
                continue  # plan signatures, not calls: only grid variants widen into calls
            s = matrix.shapes[v.shapes]
            wide = dataclasses.replace(s, batch=tuple(range(1, 1 + 4 * scale)), heads=tuple(sorted({*s.heads, 8, 64})))
            for c in v.calls(wide):
                out[(v.name, c)] = None
                if len(out) >= count:
                    return list(out)
    return list(out)


def projection(ray_build: dict, plan: dict, overhead: dict, workers: int = 256, configs: int = 30044) -> dict:
    """Wall time for `configs` kernels (and as many calls) on `workers` workers, from the measured CPU seconds
    (a dedicated worker turns CPU seconds into wall seconds; this machine's were shared)."""
    per_kernel_cpu = ray_build["cpu_seconds"] / ray_build["kernels"]  # compile, export, Ray, store writes
    per_call_plan = plan["cpu_seconds"] / plan["calls"]
    compile_s = configs * per_kernel_cpu / workers  # per_kernel_cpu already holds Ray's per-task cost
    plan_s = configs * per_call_plan / workers
    return {"workers": workers, "kernels": configs, "per_kernel_cpu_s": round(per_kernel_cpu, 3),
            "per_call_plan_cpu_s": round(per_call_plan, 5),
            "per_task_overhead_cpu_s": overhead["per_task_cpu_ms"] / 1000,
            "compile_s": round(compile_s, 1), "plan_s": round(plan_s, 1), "total_s": round(compile_s + plan_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sku", default="h200")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--plan-calls", type=int, default=30000)
    parser.add_argument("--only", action="append", help="build only these variants (default: the whole matrix)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plan-only", action="store_true", help="only (c): planning of --plan-calls calls")
    parser.add_argument("--started-cluster", action="store_true",
                        help="start Ray before timing each build (a farm's cluster outlives its builds)")
    args = parser.parse_args()
    matrix = variants.load(config.default_variants_file())
    sku = matrix.sku(args.sku)
    work = orchestrator.work_of(matrix, sku, matrix.select(args.only or []) if args.only else None)
    if args.plan_only:
        calls = many_calls(matrix, sku, args.plan_calls)
        plans = [timed_build(kind, args.jobs, sku, calls, dry_run=True) for kind in ("local", "ray")]
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()}-core {platform.machine()}, no GPU",
               "sku": args.sku, "planning": [{k: v for k, v in p.items() if k != "keys"} for p in plans]}
        print(json.dumps(doc), flush=True)
        if args.out:
            args.out.write_text(json.dumps(doc, indent=1))
        return
    builds = []
    for _ in range(args.rounds):
        for kind in ("local", "ray"):
            builds.append(timed_build(kind, args.jobs, sku, work, started_cluster=args.started_cluster))
            print(json.dumps({k: v for k, v in builds[-1].items() if k != "keys"}), flush=True)
    assert len({tuple(b["keys"]) for b in builds}) == 1, "executors built different kernel sets"
    overhead = task_overhead(args.jobs, sku)
    print(json.dumps(overhead), flush=True)
    calls = many_calls(matrix, sku, args.plan_calls)
    plans = [timed_build(kind, args.jobs, sku, calls, dry_run=True) for kind in ("local", "ray")]
    for p in plans:
        print(json.dumps({k: v for k, v in p.items() if k != "keys"}), flush=True)
    local = [b for b in builds if b["executor"] == "local"]
    ray_ = [b for b in builds if b["executor"] == "ray"]
    ratio = statistics.mean(b["kernels_per_min"] for b in ray_) / statistics.mean(b["kernels_per_min"] for b in local)
    cpu_ratio = (statistics.mean(b["kernels_per_cpu_min"] for b in ray_)
                 / statistics.mean(b["kernels_per_cpu_min"] for b in local))
    doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()}-core {platform.machine()}, no GPU",
           "sku": args.sku, "builds": [{k: v for k, v in b.items() if k != "keys"} for b in builds],
           "ray_over_local": round(ratio, 3), "ray_over_local_per_cpu": round(cpu_ratio, 3),
           "task_overhead": overhead,
           "planning": [{k: v for k, v in p.items() if k != "keys"} for p in plans],
           "projection": projection(ray_[0], plans[1], overhead)}
    print(json.dumps({k: doc[k] for k in ("ray_over_local", "ray_over_local_per_cpu", "projection")}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
