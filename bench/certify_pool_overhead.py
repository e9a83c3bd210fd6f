"""The certification pool's own cost, with no GPU: `python bench/certify_pool_overhead.py [--before SRC] [--jobs 16]
[--seconds 0.1] [--checks N] [--out JSON]`.

certify's parent process hands checks to its workers and reads their answers (certify/pool.py). This runs the real
Pool over the checks of the default h100-sxm build's certification (the journal beside this script, 9,230 checks),
with workers that speak the checker's protocol and spend `--seconds` on each check instead of running it (a
forward's part line, a backward's for training checks, then a pass). The ideal wall time is checks x seconds /
jobs; what the run takes beyond it is the parent's. With `--before SRC` (a checkout of another version, e.g.
`git worktree add /tmp/before HEAD~1`) it runs that version's Pool too, alternating, one process each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOURNAL = HERE / "default_certify_journal-h100-2026-12-06.tar.gz"
WORKER = """
import json, sys, time
for line in sys.stdin:
    r = json.loads(line)
    say = lambda d: (sys.stdout.write(json.dumps(d) + "\\n"), sys.stdout.flush())
    say({"id": r["id"], "part": "fwd"})
    time.sleep(SECONDS / 2)
    if r["check"]["sig"]["pass_"].startswith("bwd"):
        say({"id": r["id"], "part": "bwd"})
    time.sleep(SECONDS / 2)
    say({"id": r["id"], "status": "pass", "failures": []})
"""
RUN = """
import inspect, json, sys, time
from pathlib import Path
from fa4_aot.certify.plan import Check
from fa4_aot.certify.pool import Pool
checks = [(d["id"], Check.from_dict(d["check"])) for d in map(json.loads, sys.stdin)]
kwargs = {"capacity": lambda _gpu: 72 << 30} if "capacity" in inspect.signature(Pool).parameters else {}
pool = Pool(Path("/nonexistent"), "h100-sxm", [0], JOBS, 600.0, command=[sys.executable, "-c", WORKER],
            startup=60.0, **kwargs)
lost = set()
start, cpu = time.monotonic(), time.process_time()
n = sum(1 for _ in pool.run(checks, skip=lambda c: frozenset(u.kernel_key for u in c.kernels) in lost))
print(json.dumps({"outcomes": n, "wall": time.monotonic() - start, "parent_cpu": time.process_time() - cpu}))
"""


def checks(limit: int | None) -> list[str]:
    """The journal's checks, one JSON line each ({"id", "check"}), each once, in the journal's order."""
    with tarfile.open(JOURNAL) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".jsonl"))
        lines = tar.extractfile(member).read().decode().splitlines()  # type: ignore[union-attr]
    seen: dict[str, str] = {}
    for line in lines:
        doc = json.loads(line)
        seen.setdefault(doc["id"], json.dumps({"id": doc["id"], "check": doc["check"]}))
    return list(seen.values())[:limit]


def run(src: Path, lines: list[str], jobs: int, seconds: float) -> dict[str, float]:
    code = RUN.replace("JOBS", str(jobs)).replace("WORKER", repr(WORKER.replace("SECONDS", str(seconds))))
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", code], input="\n".join(lines), capture_output=True, text=True,
                          env=env, check=True, cwd=src)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=0.1, help="what each scripted check takes")
    parser.add_argument("--checks", type=int, help="the first N checks only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = checks(args.checks)
    ideal = len(lines) * args.seconds / args.jobs
    found: dict[str, dict[str, float]] = {}
    versions = {"after": HERE.parent, **({"before": args.before} if args.before else {})}
    for name, src in versions.items():
        found[name] = run(src, lines, args.jobs, args.seconds)
        found[name]["over_ideal"] = found[name]["wall"] / ideal
        print(f"{name}: {found[name]['outcomes']} outcomes in {found[name]['wall']:.1f} s "
              f"({found[name]['over_ideal']:.2f}x the ideal {ideal:.1f} s), parent CPU "
              f"{found[name]['parent_cpu']:.1f} s", flush=True)
    doc = {"date": time.strftime("%Y-%m-%d"), "host_cpus": os.cpu_count(), "checks": len(lines), "jobs": args.jobs,
           "seconds_per_check": args.seconds, "ideal_wall": ideal, "runs": found}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
