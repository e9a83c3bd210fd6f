"""L2-aware scheduling (issue 13): kernel time with FA4's hard-coded L2 budget vs the SKU's, side by side.

FA4 sizes its head swizzle from `size_l2 = 50 MiB` (tile_scheduler.py), tuned on the H100 (50 MiB L2). A SKU
with `l2_budget = true` compiles the kernels that read it with its own L2 instead (fa4_aot/fa4/l2.py; 60 MiB on
the H200). On sm_90 the budget is read by the LPT schedulers only: dense causal forward and deterministic
backward. Non-causal forward and the ordinary backward read no budget, so both variants load the same kernel
there (a control: their times must agree within noise).

    python bench/l2_budget.py --out bench/l2_budget-h200.json [--store DIR] [--sku h200] [--no-build]
    python bench/l2_budget.py --build-only --store DIR      # on a CPU host; then --no-build --store DIR on the GPU

Steps: (1) build both variants of every kernel the calls need into --store (default: a fresh temp folder),
CPU-side in spawned workers (`fa4_aot.compile.orchestrator.build_calls`; a minute on a 16-core host), unless --no-build
and the store already holds them; (2) one fresh process per variant installs fa4_aot in strict mode from that
store with a variants table whose SKU row has `l2_budget` off or on (0 compiles is checked) and times each call
with CUDA events (median of --iters after warm-up); (3) prints the table and the swizzle each budget gives,
and, unmeasured, the Blackwell budget (B200 row) and its swizzle for the same shapes.
Sequence lengths are picked where 50 and 60 MiB give different power-of-two swizzles (14336, 28672, 57344 for
d=128) plus 16384, where they give the same (a control).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4_aot.domain.calls import Call  # noqa: E402
from fa4_aot.domain.skus import FA4_L2_BUDGET, MIB, Sku, l2_budgets  # noqa: E402
from fa4_aot.matrix import variants  # noqa: E402

CASES = [("fwd", "causal"), ("fwd", "full"), ("bwd", "causal"), ("bwd", "full"), ("bwd_det", "causal")]
HEADS, DIM = 32, 128


def calls(seqlens: list[int]) -> list[tuple[str, Call]]:
    return [(f"{p}-{m}-{s}", Call.from_dict({
        "layout": "dense", "pass_": p, "dtype": "bf16", "head_dim": DIM, "head_dim_v": DIM, "mask": m,
        "window": (0, 0), "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 1, "seqlen_q": s,
        "seqlen_k": s, "heads_q": HEADS, "heads_kv": HEADS})) for s in seqlens for p, m in CASES]


def swizzle(budget: int, seqlen: int, backward: bool) -> int:
    """Heads walked together by FA4's LPT scheduler (tile_scheduler.py, fwd and bwd Params.create)."""
    per_head = seqlen * (DIM + DIM) * 2 + (seqlen * DIM * 4 if backward else 0)
    return 1 if budget < per_head else 1 << ((budget // per_head).bit_length() - 1)


def table_with(sku: Sku, on: bool, folder: Path) -> Path:
    path = folder / f"variants-{'on' if on else 'off'}.toml"
    path.write_text(f'[skus.{sku.name}]\narch = "{sku.arch}"\nsm_count = {sku.sm_count}\n'
                    f"l2_bytes = {sku.l2_bytes}\ncuda_major = {sku.cuda_major}\nl2_budget = {str(on).lower()}\n")
    return path


CHILD = r"""
import json, sys, torch
import fa4_aot
from flash_attn.cute import flash_attn_func
store, table, iters, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
inst = fa4_aot.install("strict", cache_dir=store, variants_file=table)
def timed(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]
out = {}
for label, p, causal, s in cases:
    q, k, v = (torch.randn(1, s, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=p != "fwd")
               for _ in range(3))
    if p == "fwd":
        with torch.no_grad():
            out[label] = timed(lambda: flash_attn_func(q, k, v, causal=causal))
    else:
        o = flash_attn_func(q, k, v, causal=causal, deterministic=p == "bwd_det")[0]
        g = torch.randn_like(o)
        out[label] = timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
print(json.dumps({"ms": out, "compiled": inst.stats.compiled, "loaded": inst.stats.loaded}))
"""


def measure(store: Path, table: Path, seqlens: list[int], iters: int) -> dict:
    cases = [(f"{p}-{m}-{s}", p, m == "causal", s) for s in seqlens for p, m in CASES]
    env = {k: v for k, v in os.environ.items() if k not in ("FA4_AOT_SKU", "FA4_AOT_SERVER")}
    run = subprocess.run([sys.executable, "-c", CHILD, str(store), str(table), str(iters), json.dumps(cases)],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    if run.returncode:
        sys.exit(f"measuring with {table.name} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def build_both(sku: Sku, store: Path, seqlens: list[int], jobs: int) -> list[dict]:
    from fa4_aot.compile.orchestrator import build_calls
    from fa4_aot.store import Store

    reports = []
    for on in (False, True):
        report = build_calls(replace(sku, l2_budget=on), Store(store), calls(seqlens), jobs=jobs)
        if report.failed:
            sys.exit(f"build failed: {report.to_dict()['failures'][:3]}")
        reports.append({"l2_budget": on, **{k: v for k, v in report.to_dict().items() if k != "kernel_keys"}})
    return reports


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sku", default="h200")
    ap.add_argument("--store", type=Path, help="store to build into / measure from (default: a fresh temp folder)")
    ap.add_argument("--no-build", action="store_true", help="the store already holds both variants")
    ap.add_argument("--build-only", action="store_true", help="build both variants into --store and stop (on a CPU "
                                                              "host; carry the store to the GPU host)")
    ap.add_argument("--seqlens", default="14336,16384,28672,57344")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("-j", "--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    seqlens = [int(s) for s in args.seqlens.split(",")]
    table = variants.load(ROOT / "variants.toml").skus
    sku, blackwell = table[args.sku], table["b200"]
    store = args.store or Path(tempfile.mkdtemp(prefix="fa4-aot-l2-"))
    builds = [] if args.no_build else build_both(sku, store, seqlens, args.jobs)
    if args.build_only:
        print(json.dumps({"store": str(store), "builds": builds}, indent=1))
        return
    folder = Path(tempfile.mkdtemp(prefix="fa4-aot-l2-tables-"))
    runs = {on: measure(store, table_with(sku, on, folder), seqlens, args.iters) for on in (False, True)}
    doc = report(sku, blackwell, seqlens, runs, builds, store)
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


def report(sku: Sku, blackwell: Sku, seqlens: list[int], runs: dict, builds: list, store: Path) -> dict:
    ours, bw = l2_budgets(sku.l2_bytes)[0], l2_budgets(blackwell.l2_bytes)[0]
    rows = []
    for s in seqlens:
        for p, m in CASES:
            label, backward = f"{p}-{m}-{s}", p != "fwd"
            off, on = runs[False]["ms"][label], runs[True]["ms"][label]
            rows.append({"case": label, "default_ms": round(off, 4), "sku_budget_ms": round(on, 4),
                         "speedup": round(off / on, 4),
                         "swizzle_default": swizzle(FA4_L2_BUDGET, s, backward),
                         f"swizzle_{sku.name}": swizzle(ours, s, backward),
                         "budget_read": (m == "causal" and p == "fwd") or p == "bwd_det"})
    print(f"{'case':<22}{'default ms':>11}{'SKU ms':>9}{'x':>7}  swizzle 50 MiB -> {ours // MIB} MiB",
          file=sys.stderr)
    for r in rows:
        print(f"{r['case']:<22}{r['default_ms']:>11.3f}{r['sku_budget_ms']:>9.3f}{r['speedup']:>7.3f}  "
              f"{r['swizzle_default']} -> {r[f'swizzle_{sku.name}']}{'' if r['budget_read'] else ' (same kernel)'}",
              file=sys.stderr)
    unmeasured = [{"seqlen": s, "pass": ("bwd" if b else "fwd"), "swizzle_default": swizzle(FA4_L2_BUDGET, s, b),
                   f"swizzle_{blackwell.name}": swizzle(bw, s, b)} for s in seqlens for b in (False, True)]
    return {"sku": sku.name, "l2_bytes": sku.l2_bytes, "budget_default": FA4_L2_BUDGET, "budget_sku": ours,
            "store": str(store), "builds": builds, "compiled_at_run": [runs[False]["compiled"], runs[True]["compiled"]],
            "rows": rows, "blackwell_unmeasured": {"sku": blackwell.name, "l2_bytes": blackwell.l2_bytes,
                                                   "budget": bw, "prepare_budget": l2_budgets(blackwell.l2_bytes)[1],
                                                   "swizzle": unmeasured}}


if __name__ == "__main__":
    main()
