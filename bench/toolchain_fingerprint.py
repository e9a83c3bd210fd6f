"""What the toolchain fingerprint costs (issue 20, point 5): hashing the Python source of FA4, the CuTe DSL and
quack and fa4-aot's FA4 patches, once per process (fa4_aot/fa4/versions.py).

Each round runs fresh interpreters: `cold` first evicts every hashed file from the page cache
(posix_fadvise DONTNEED, this machine's other files untouched), `warm` runs with them cached; `cached` is a second
toolchain() call in one process (lru_cache). For scale, the same rounds time what every process that computes
keys pays anyway: importing the CuTe DSL (toolchain() reads its CUDA flavour) and FA4's interface.

    python bench/toolchain_fingerprint.py --rounds 5 --out bench/toolchain_fingerprint-cpu-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, time
t = time.perf_counter()
from fa4_aot.fa4 import versions
t0 = time.perf_counter()
sources = versions.sources()
t1 = time.perf_counter()
dists = versions.distributions()
t2 = time.perf_counter()
versions.toolchain()
t3 = time.perf_counter()
versions.toolchain()
t4 = time.perf_counter()
import flash_attn.cute.interface
t5 = time.perf_counter()
print(json.dumps({"sources": t1 - t0, "distributions": t2 - t1, "cutlass_import": t3 - t2, "cached": t4 - t3,
                  "fa4_import": t5 - t4}))
"""


def hashed_files() -> list[Path]:
    sys.path.insert(0, str(ROOT))
    from fa4_aot.fa4 import versions

    files = [Path(versions.__file__).parent / name for name in versions.PATCHES]
    for name in versions.SOURCE_PACKAGES:
        root = versions.package_root(name)
        files += [path for _rel, path in versions._python_files(root)] if root else []
    return files


def evict(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def one(files: list[Path], cold: bool) -> dict[str, float]:
    if cold:
        evict(files)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    files = hashed_files()
    runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    for _ in range(args.rounds):  # cold and warm alternate, so both see the same load on this shared host
        runs["cold"].append(one(files, cold=True))
        runs["warm"].append(one(files, cold=False))
    summary = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    doc = {"machine": platform.node(), "cpus": os.cpu_count(), "load": os.getloadavg(), "files": len(files),
           "bytes": sum(p.stat().st_size for p in files), "median_s": summary, "runs": runs}
    print(json.dumps(summary, indent=1), f"\n{len(files)} files, {doc['bytes']} bytes")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
