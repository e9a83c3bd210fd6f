"""NumSim (tirx-harness's numerical GPU model, on the CPU) of TIRx FA4 kernels as `fa4-aot build --family tirx`
stores them for several SKUs: per problem and SKU, the stored kernel (key, object, the constant it consumed), the
digest the simulated TIR compiles to (must be the stored object's), each stage's seconds, and the output's check
against the float32 reference (FA4's bound), or where NumSim stopped and why.

Runs in .venv (the simulation itself in .venv-numsim, which ./test.sh makes; fa4_aot/tirx/simulation.py):
    .venv/bin/python bench/tirx_numsim.py                      # the default problems, b200 and gb200
    .venv/bin/python bench/tirx_numsim.py --sku b200,gb200 b1-q128-k128-h150-kv150-d128-full
The kernels are built into a fresh store (`fa4-aot build --sku S --family tirx`, the SKU rows of variants.toml);
--store DIR uses and keeps that store. One JSON document per line on stdout, and all of them in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa4_aot.domain.sku_table import table  # noqa: E402
from fa4_aot.store import Store  # noqa: E402
from fa4_aot.tirx import simulation  # noqa: E402
from fa4_aot.tirx.loading import find  # noqa: E402
from fa4_aot.tirx.problem import Problem, schedule  # noqa: E402

# the smallest problems the port traces (one query tile pair; one and two heads, GQA 2), and one of 150 tasks,
# the smallest whose kernel differs between b200 and gb200 (persistent grids of 148 and 150 CTAs)
PROBLEMS = ["b1-q128-k128-h1-kv1-d128-full", "b1-q128-k128-h1-kv1-d128-causal", "b1-q256-k256-h2-kv1-d128-causal",
            "b1-q128-k128-h150-kv150-d128-full"]


def variants_file(skus: list[str], problems: list[str], folder: Path) -> Path:
    """A variants file of the project's rows for `skus` and one [[tirx]] entry of `problems`."""
    rows = tomllib.loads((ROOT / "variants.toml").read_text())["skus"]
    lines = []
    for name in skus:
        lines.append(f"[skus.{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in rows[name].items()]
    lines += ["[[tirx]]", 'name = "numsim-bench"', f"problems = {json.dumps(problems)}"]
    path = folder / "variants.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def build(store: Path, skus: list[str], variants: Path) -> float:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fa4_aot", "build", "--sku", ",".join(skus), "--family", "tirx",
                           "--variants", str(variants), "--json"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "FA4_AOT_CACHE": str(store)})
    if done.returncode != 0:
        sys.exit(f"fa4-aot build failed: {done.stderr[-3000:]}")
    return time.monotonic() - start


def one(store: Store, problem: Problem, sku_name: str, variants: Path) -> dict:
    sku = table(variants)[sku_name]
    entry = find(store, problem, sku, sku.constants())
    sched = schedule(problem, sku.constants())
    start = time.monotonic()
    sim = simulation.run(entry, sched, simulation.inputs(problem))
    doc = {"problem": str(problem), "sku": sku_name, "kernel_key": entry.kernel_key, "object": entry.object_digest,
           "consumed": entry.hardware_queries, "grid": sched.grid, "l2_swizzle": sched.l2_swizzle,
           "rebuilt_is_stored": sim.rebuilt_digest == entry.object_digest, "seconds": sim.seconds,
           "wall_s": round(time.monotonic() - start, 1), "harness": sim.harness}
    if sim.blocked:
        lines = [line.strip() for line in sim.blocked["error"].splitlines() if line.strip()]
        doc["blocked"] = {"stage": sim.blocked["stage"], "error": lines[0][:200],
                          "cause": [line for line in lines if line.startswith("error:")][:1] + lines[-1:]}
    if sim.check:
        doc["check"] = {"ok": sim.check.ok, "max_error": sim.check.max_error, "bound": sim.check.bound}
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=PROBLEMS)
    parser.add_argument("--sku", default="b200,gb200")
    parser.add_argument("--store", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    skus = args.sku.split(",")
    with tempfile.TemporaryDirectory(prefix="tirx-numsim-") as tmp:
        variants = variants_file(skus, args.problems, Path(tmp))
        root = args.store or Path(tmp) / "store"
        docs = [{"built": args.problems, "skus": skus, "build_s": round(build(root, skus, variants), 1)}]
        print(json.dumps(docs[0]), flush=True)
        for text in args.problems:
            for sku in skus:
                docs.append(one(Store(root), Problem.parse(text), sku, variants))
                print(json.dumps(docs[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(docs, indent=1) + "\n")


if __name__ == "__main__":
    main()
