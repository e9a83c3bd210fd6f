"""What certification costs, on a GPU: the run itself (`fa4-aot certify`: seconds, checks and kernels a second,
and the time the default h200 build's 2,485 kernels would take at that rate) and a certified kernel's first call
against an unchecked one's, side by side in alternating fresh processes (FA4 over install() and the lean
runtime; the certified store holds a `pass` verdict for every kernel the call loads, the other none).

    FA4_AOT_CACHE=<store of tests/data/certify_variants.toml> python bench/certify_cost.py --out OUT.json

The store is copied twice (one to certify, one left unchecked); the original is not written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD_KERNELS = 2485  # the default h200 build (bench/RESULTS.md, 2026-12-02)
CHILD = r"""
import sys, time, json, torch
runtime = sys.argv[1]
q, k, v = (torch.randn(2, 2048, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
torch.cuda.synchronize()
t0 = time.perf_counter()
if runtime == "fa4":
    import fa4_aot
    fa4_aot.install("strict")
    from flash_attn.cute import flash_attn_func
else:
    from fa4_aot import flash_attn_func
out = flash_attn_func(q, k, v, causal=True)[0]
out.float().sum().backward()
torch.cuda.synchronize()
print(json.dumps({"fwd_bwd_first_ms": (time.perf_counter() - t0) * 1e3}))
"""


def certify(store: Path, variants: Path, jobs: int) -> dict[str, object]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "fa4_aot", "--cache-dir", str(store), "certify", "--sku", "h200",
                             "--variants", str(variants), "--recheck-known-bad", "--json", "-q", "-j", str(jobs),
                             "--deadline", "60"],
                            capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"certify failed: {result.stderr[-3000:]}")
    doc = json.loads(result.stdout)
    kernels = len(doc["verdicts"])
    return {"seconds": round(seconds, 1), "checks": doc["checks"], "kernels": kernels, "counts": doc["counts"],
            "checks_per_second": round(doc["checks"] / seconds, 2), "kernels_per_second": round(kernels / seconds, 3),
            "default_build_minutes_at_this_rate": round(DEFAULT_BUILD_KERNELS / (kernels / seconds) / 60, 1),
            "jobs_per_gpu": jobs, "unreached": len(doc["unreached"]), "errors": doc["errors"][:20],
            "verdicts": [{k: v[k] for k in ("kernel_key", "status", "tensor", "error", "bound", "detail", "calls")}
                         for v in doc["verdicts"] if v["status"] != "pass"]}


def first_calls(stores: dict[str, Path], runtime: str, repeats: int) -> dict[str, object]:
    """Alternating fresh processes over the certified and the unchecked store: the first fwd+bwd in ms."""
    found: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(repeats):
        for name, store in stores.items():
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
            env = {**os.environ, "FA4_AOT_CACHE": str(store), "FA4_AOT_SKU": "h200", "PYTHONPATH": path}
            out = subprocess.run([sys.executable, "-c", CHILD, runtime], capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"{runtime} first call on {name} failed: {out.stderr[-2000:]}")
            found[name].append(json.loads(out.stdout.strip().splitlines()[-1])["fwd_bwd_first_ms"])
    medians = {name: statistics.median(v) for name, v in found.items()}
    return {"runs_ms": found, "median_ms": medians,
            "certified_over_unchecked": round(medians["certified"] / medians["unchecked"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--variants", type=Path, default=ROOT / "tests" / "data" / "certify_variants.toml")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    source = Path(os.environ["FA4_AOT_CACHE"])
    work = Path(tempfile.mkdtemp(prefix="fa4-aot-certify-bench-"))
    stores = {name: Path(shutil.copytree(source, work / name, symlinks=True)) for name in ("certified", "unchecked")}
    doc: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "certify": certify(stores["certified"], args.variants,
                                                                                  args.jobs)}
    for runtime in ("lean", "fa4"):
        doc[f"first_call_{runtime}"] = first_calls(stores, runtime, args.repeats)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc.items() if k != "certify"} | {"certify": {
        k: v for k, v in doc["certify"].items() if k != "verdicts"}}, indent=1))  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
