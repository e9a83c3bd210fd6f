"""Build throughput on this machine: kernels per wall minute and per CPU second (issue 29, part 3).

    python bench/build_speed.py --sku h200 [--variants FILE] [--subset train-fp16 ...] [--json FILE]
    python bench/build_speed.py --tree OLD --tree NEW [--subset ...] [--runs 2] [--jobs 2] [--json FILE]

Default: (b) the same subset of variants is built into fresh stores with 1 and with 2 jobs; (c) the whole matrix
is built into a fresh store with 2 jobs, then built again (no-op).
Trees (`--tree` twice or more): the subset is built with each tree's fa4_aot in turn (A B A B ...), each build a
fresh interpreter (PYTHONPATH=the tree) with a fresh store and fresh compile caches; then the trees' kernel keys
and recipe file names are compared. Every build is `orchestrator.build` as `fa4-aot build` runs it: planning with
recording, compiling, linking.

CPU seconds are user + system of the build process and every process under it: getrusage RUSAGE_SELF +
RUSAGE_CHILDREN before and after. That is complete because the local executor's pool is shut down with wait
(its workers joined, so reaped) and each worker waits for its own subprocesses (zig); in trees mode the parent
takes RUSAGE_CHILDREN around the child interpreter, whose start and imports then count too. On a shared host this,
not wall time, is the figure. Fresh caches: CuTe DSL's and FA4's file caches, quack's, zig's global and local
caches, fa4-aot's host libraries, XDG_CACHE_HOME and TMPDIR all point into the build's own temporary folder.
Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# every cache a build could share with an earlier one, pointed into the build's own folder
CACHE_VARS = {"FA4_AOT_HOST_LIBS": "host-libs", "CUTE_DSL_CACHE_DIR": "cute-dsl",
              "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "fa4-cute", "QUACK_CACHE_DIR": "quack",
              "ZIG_GLOBAL_CACHE_DIR": "zig-global", "ZIG_LOCAL_CACHE_DIR": "zig-local", "XDG_CACHE_HOME": "xdg",
              "TMPDIR": "tmp"}


def fresh_caches(folder: Path) -> dict[str, str]:
    """The environment that gives a build `folder`/store and fresh compile caches under `folder`."""
    env = {"FA4_AOT_CACHE": str(folder / "store")}
    for var, name in CACHE_VARS.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        env[var] = str(folder / name)
    return env


def cpu_seconds() -> float:
    """User + system seconds of this process and of its reaped descendants."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class LoadSampler:
    """The 1-minute load average every `every` seconds while the block runs: its mean and max."""

    def __init__(self, every: float = 15.0) -> None:
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        return {"load1_mean": round(sum(self.samples) / len(self.samples), 2),
                "load1_max": round(max(self.samples), 2)}


def rates(built: int, seconds: float, cpu: float) -> dict[str, float]:
    return {"kernels_per_min": round(built / seconds * 60, 2) if built else 0.0,
            "kernels_per_cpu_second": round(built / cpu, 4) if built and cpu else 0.0}


def timed_build(variants_file: Path, sku: str, folder: Path, names: list[str] | None, jobs: int,
                detail: bool = False) -> dict[str, Any]:
    """Build `names` (default: all) into `folder`/store with fresh caches there, in this process."""
    from fa4_aot.compile import orchestrator
    from fa4_aot.matrix import variants
    from fa4_aot.store import Store

    os.environ.update(fresh_caches(folder))  # the pool's workers are spawned by this build, with this environment
    matrix = variants.load(variants_file)
    store = Store(folder / "store")
    started, cpu = time.perf_counter(), cpu_seconds()
    report = orchestrator.build(matrix, matrix.sku(sku), store, matrix.select(names), jobs=jobs)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    doc = report.to_dict()
    assert report.failed == 0, doc["failures"][:3]
    out: dict[str, Any] = {"jobs": jobs, "built": report.count("built"), "present": report.count("present"),
                           "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "regions": report.recipes,
                           "lean_failures": len(report.lean_failures), **rates(report.count("built"), seconds, cpu)}
    if detail:
        out |= {"kernel_keys": doc["kernel_keys"], "recipe_files": recipe_files(store)}
    return out


def recipe_files(store: Any) -> dict[str, int]:
    """{recipe file key: regions in it} of `store`."""
    from fa4_aot.store import recipes

    names = sorted(p.name.split(".")[0] for p in (store.root / "recipes").rglob("*.json") if p.is_file())
    return {name: len(recipes.load(store, name)) for name in names}


def tree_build(tree: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One build of the subset with `tree`'s fa4_aot, in a fresh interpreter; CPU seconds of it and everything
    under it (RUSAGE_CHILDREN around it: this process runs one child at a time)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(folder), "--sku", args.sku,
               "--variants", str(args.variants), "--jobs", str(args.jobs), *(f"--subset={s}" for s in args.subset)]
    env = {**os.environ, **fresh_caches(folder), "PYTHONPATH": str(tree)}
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with LoadSampler() as load:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=4 * 3600)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the build with {tree} failed:\n{done.stderr[-3000:]}")
    inner = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime
    return {**inner, "wall_seconds": round(seconds, 1), "process_cpu_seconds": round(cpu, 1),
            "process_user_seconds": round(after.ru_utime - kids.ru_utime, 1), **load.summary(),
            "process_kernels_per_cpu_second": rates(inner["built"], seconds, cpu)["kernels_per_cpu_second"]}


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tree: the mean of its runs, and whether its runs and the first tree built the same keys and files."""
    first = runs[0]
    out: dict[str, Any] = {}
    for tree in dict.fromkeys(r["tree"] for r in runs):
        mine = [r for r in runs if r["tree"] == tree]
        mean = {k: round(sum(r[k] for r in mine) / len(mine), 2) for k in
                ("wall_seconds", "process_cpu_seconds", "built", "regions")}
        # over all its runs: kernels built / CPU seconds spent
        rate = sum(r["built"] for r in mine) / sum(r["process_cpu_seconds"] for r in mine)
        out[tree] = {"runs": len(mine), **mean, "process_kernels_per_cpu_second": round(rate, 4),
                     "same_kernel_keys": all(r["kernel_keys"] == first["kernel_keys"] for r in mine),
                     "same_recipe_files": all(set(r["recipe_files"]) == set(first["recipe_files"]) for r in mine),
                     "keys_only_here": sorted(set(mine[0]["kernel_keys"]) - set(first["kernel_keys"])),
                     "keys_missing_here": sorted(set(first["kernel_keys"]) - set(mine[0]["kernel_keys"])),
                     "files_only_here": sorted(set(mine[0]["recipe_files"]) - set(first["recipe_files"])),
                     "files_missing_here": sorted(set(first["recipe_files"]) - set(mine[0]["recipe_files"]))}
    return out


def trees_mode(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for n in range(args.runs):
        for tree in args.tree:
            with tempfile.TemporaryDirectory(prefix="build-speed-") as tmp:
                row = {"run": n, "tree": str(tree), **tree_build(tree, args, Path(tmp))}
            runs.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("kernel_keys", "recipe_files")}),
                  file=sys.stderr, flush=True)
    summary = compare(runs)
    names = list(summary)
    print(f"{'tree':<28}{'runs':>5}{'wall s':>9}{'CPU s':>9}{'kernels':>9}{'k/CPU s':>9}{'regions':>9}"
          "  same keys/files")
    for name, s in summary.items():
        print(f"{name[-28:]:<28}{s['runs']:>5}{s['wall_seconds']:>9.1f}{s['process_cpu_seconds']:>9.1f}"
              f"{s['built']:>9.0f}{s['process_kernels_per_cpu_second']:>9.4f}{s['regions']:>9.0f}  "
              f"{s['same_kernel_keys']}/{s['same_recipe_files']}")
    last, first = summary[names[-1]], summary[names[0]]
    ratio = round(last["process_kernels_per_cpu_second"] / first["process_kernels_per_cpu_second"], 2)
    print(f"kernels per CPU second, {names[-1]} / {names[0]}: {ratio}x")
    commits = {str(t): subprocess.run(["git", "-C", str(t), "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip() for t in args.tree}
    return {"subset": args.subset, "jobs": args.jobs, "variants": str(args.variants), "commits": commits, "runs": runs,
            "summary": summary, "ratio_kernels_per_cpu_second_last_over_first": ratio}


def default_mode(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        one = timed_build(args.variants, args.sku, Path(tmp) / "j1", args.subset, jobs=1)
        two = timed_build(args.variants, args.sku, Path(tmp) / "j2", args.subset, jobs=2)
        full = timed_build(args.variants, args.sku, Path(tmp) / "full", None, jobs=2)
        noop = timed_build(args.variants, args.sku, Path(tmp) / "full", None, jobs=2)
    rows = [(f"subset {'+'.join(args.subset)}, 1 job", one), (f"subset {'+'.join(args.subset)}, 2 jobs", two),
            ("default matrix, 2 jobs, empty store", full), ("default matrix, 2 jobs, no-op rebuild", noop)]
    print(f"{'build (' + args.sku + ')':<52}{'built':>7}{'present':>9}{'seconds':>9}{'CPU s':>9}"
          f"{'kernels/min':>13}{'k/CPU s':>9}{'regions':>9}")
    for name, r in rows:
        print(f"{name:<52}{r['built']:>7}{r['present']:>9}{r['seconds']:>9.1f}{r['cpu_seconds']:>9.1f}"
              f"{r['kernels_per_min']:>13.1f}{r['kernels_per_cpu_second']:>9.4f}{r['regions']:>9}")
    print(f"2 jobs vs 1 job: {two['kernels_per_min'] / one['kernels_per_min']:.2f}x kernels/min; "
          f"no-op rebuild / full build: {noop['seconds'] / full['seconds']:.3f}")
    return {"one_job": one, "two_jobs": two, "full": full, "noop": noop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sku", default="h200")
    parser.add_argument("--variants", type=Path, help="variants file (default: this checkout's)")
    parser.add_argument("--subset", action="append", default=None, help="a variant to build (repeat)")
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to build with (trees mode)")
    parser.add_argument("--runs", type=int, default=2, help="builds per tree (trees mode)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (trees mode)")
    parser.add_argument("--json", "--out", dest="out", type=Path, help="write the results here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one build of trees mode, in this folder
    args = parser.parse_args()
    args.subset = args.subset or ["train-fp16", "train-deterministic"]
    if not args.child:  # this checkout's fa4_aot; a child imports its tree's (PYTHONPATH)
        sys.path.insert(0, str(ROOT))
    if args.variants is None:
        from fa4_aot import config

        args.variants = config.default_variants_file().resolve()
    if args.child:
        import fa4_aot
        row = timed_build(args.variants, args.sku, args.child, args.subset, args.jobs, detail=True)
        print(json.dumps({"fa4_aot": str(Path(fa4_aot.__file__).parent), **row}))
        return
    doc = trees_mode(args) if args.tree else default_mode(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                        "sku": args.sku, "cpus": os.cpu_count(),
                                        "machine": platform.processor() or platform.machine(), **doc}, indent=1))


if __name__ == "__main__":
    main()
