"""What a warm process pays for the first call of a signature it has not run yet: the lean runtime against FA4 over
fa4_aot.install(), on a certified store and on an unchecked one, in fresh processes (goal: the lean runtime's first
forward and first backward each at most 2 ms of host time, and at most what FA4 over install() pays).

One command on a GPU host of a SKU of variants.toml (h100-sxm, h200), from the repository root, in an environment
with torch (CUDA), flash-attn-4 and the build extras (FA4 plans the build; ziglang links the lean libraries):

    python bench/lean_new_signature.py --out /tmp/new_signature.json [--before DIR] [--rounds 3] [--work DIR]

It finds the GPU's SKU as `fa4-aot certify` does (cli/certify_cmds.gpu_sku: one line and exit 2 without a GPU,
or with one that is no SKU's), then, for each version measured, in its own folder of --work (default: a fresh
temporary folder, removed at the end; a --work folder is kept, and a version's stores there are reused once they
were built and certified, so a rerun times only):
1. builds exactly the calls it times with that version (`python -m fa4_aot build --sku SKU --calls`): a warm-up
   signature and 6 new ones, causal bf16 training, batch 2, 2,048 tokens, 8 KV heads at GQA 1, 2 and 4, head
   dims 64 and 128 (about 30 kernels: well under 2 minutes on 16 CPUs);
2. copies that store and certifies the copy on this GPU (`python -m fa4_aot certify --sku SKU`): the certified
   store holds a verdict per kernel, the unchecked one none (the gate's default policy serves unchecked kernels);
3. runs every (version x runtime x store) in a fresh process per round, the combinations alternated within each
   round. A process warms up on one signature (CUDA, the runtime, the store's index), then calls each new
   signature twice, forward and backward each synchronised: the first call minus the second is what the new
   signature costs. The garbage collector's pauses inside each first forward and backward are counted (full
   collections apart).
It writes one JSON (every process's rows and the medians per combination) and prints a table.

--before DIR: a directory holding an older checkout of this repository (`git archive <commit> | tar -x -C DIR`);
its fa4_aot is measured too, imported by the subprocesses through PYTHONPATH, in the same run. Each version builds
and certifies its own two stores (with its own `python -m fa4_aot`), so each reads a store in the format it writes,
as its users' stores are, whatever a later version changes in the format; the compiler is the same, so the kernels
are the same bytes and the GPU's work is the same. This costs a second build and certification (about a minute
each).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = (16, 16, 96)  # heads, KV heads, head dim of the warm-up signature (not among the timed ones)
NEW = [(8 * ratio, 8, dim) for dim in (64, 128) for ratio in (1, 2, 4)]
BATCH, SEQLEN = 2, 2048
PAUSES: list[tuple[int, float]] = []  # (generation, ms) of the collector's pauses since the list was cleared


def _gc_pause(phase: str, info: dict[str, Any], started: list[float] = [0.0]) -> None:  # noqa: B006
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        PAUSES.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))


def _timed(fn: Any) -> tuple[Any, float, list[tuple[int, float]]]:
    """(fn(), its ms to the end of its GPU work, the collector's pauses inside it)."""
    import torch

    torch.cuda.synchronize()
    PAUSES.clear()
    started = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - started) * 1e3, list(PAUSES)


def _step(attn: Any, heads: int, heads_kv: int, dim: int) -> dict[str, Any]:
    import torch

    q = torch.randn(BATCH, SEQLEN, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(BATCH, SEQLEN, heads_kv, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    out, fwd, fwd_gc = _timed(lambda: attn(q, k, v, causal=True))
    out = out[0] if isinstance(out, tuple) else out
    _, bwd, bwd_gc = _timed(lambda: out.float().sum().backward())
    return {"fwd_ms": fwd, "bwd_ms": bwd, "fwd_gc": fwd_gc, "bwd_gc": bwd_gc}


def _row(dims: tuple[int, int, int], first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"heads": dims[0], "heads_kv": dims[1], "dim": dims[2]}
    for part in ("fwd", "bwd"):
        row[f"new_{part}_ms"] = round(first[f"{part}_ms"] - second[f"{part}_ms"], 3)
        row[f"first_{part}_ms"] = round(first[f"{part}_ms"], 3)
        row[f"second_{part}_ms"] = round(second[f"{part}_ms"], 3)
        row[f"first_{part}_gc_ms"] = round(sum(ms for _g, ms in first[f"{part}_gc"]), 3)
        row[f"first_{part}_full_gcs"] = sum(1 for g, _ms in first[f"{part}_gc"] if g == 2)
    return row


def child(runtime: str, out: Path) -> None:
    """One process: warm-up, then each new signature's first and second call; its rows as JSON in `out`."""
    import torch

    import fa4_aot

    if runtime == "fa4":
        fa4_aot.install()
        from flash_attn.cute import flash_attn_func as attn
    else:
        attn = fa4_aot.flash_attn_func
    gc.callbacks.append(_gc_pause)
    _step(attn, *WARM_UP)
    rows = [_row(dims, _step(attn, *dims), _step(attn, *dims)) for dims in NEW]
    doc = {"fa4_aot": str(Path(fa4_aot.__file__).parent), "device": torch.cuda.get_device_name(),
           "python": sys.version.split()[0], "rows": rows}
    out.write_text(json.dumps(doc))


def detect_sku() -> str:
    """This GPU's SKU name, found as `fa4-aot certify` finds it; one line and exit 2 when there is none."""
    sys.path.insert(0, str(ROOT))
    from fa4_aot.cli.certify_cmds import gpu_sku
    from fa4_aot.cli.common import NoGpu

    try:
        return gpu_sku(None)[0].name
    except NoGpu as e:  # one line, exit 2 as certify's
        print(f"lean_new_signature: needs a GPU of a SKU: {e.message}", file=sys.stderr)
        sys.exit(e.exit_code)


def _cli(tree: Path, args: list[str], store: Path, log: Path) -> int:
    """`python -m fa4_aot ARGS` of `tree`'s fa4_aot on `store`, its output appended to `log`; its exit status."""
    env = _env(tree, str(store))
    with log.open("a") as f:
        f.write(f"$ python -m fa4_aot {' '.join(args)}  # FA4_AOT_CACHE={store}\n")
        f.flush()
        # run in `tree`: `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH
        return subprocess.run([sys.executable, "-m", "fa4_aot", *args], env=env, stdout=f, stderr=f,
                              cwd=tree).returncode


def write_calls(path: Path) -> None:
    """The calls timed, as JSON lines (`build --calls`, the form FA4_AOT_RECORD writes)."""
    from fa4_aot.runtime.call_args import signature

    sigs = [signature("dense", "torch.bfloat16", h, d, kv, d, causal=True, training=True) for h, kv, d in
            [WARM_UP, *NEW]]
    path.write_text("".join(json.dumps(s.call(BATCH, SEQLEN, SEQLEN).to_dict()) + "\n" for s in sigs))


def prepare(sku: str, tree: Path, work: Path, jobs: int) -> dict[str, Any]:
    """`tree`'s unchecked store (the calls timed, built by its fa4_aot) and its certified copy in `work`; reused
    once both are done."""
    done = work / "stores.json"
    if done.exists():
        return {**json.loads(done.read_text()), "reused": True}
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    calls, log = work / "calls.jsonl", work / "prepare.log"
    unchecked, certified = work / "unchecked", work / "certified"
    write_calls(calls)
    started = time.perf_counter()
    if _cli(tree, ["build", "--sku", sku, "--calls", str(calls), "-j", str(jobs), "--quiet"], unchecked, log):
        sys.exit(f"lean_new_signature: {tree}'s build failed: see {log}")
    build_s = time.perf_counter() - started
    shutil.copytree(unchecked, certified, symlinks=True)
    started = time.perf_counter()
    certify = _cli(tree, ["certify", "--sku", sku, "-j", str(min(jobs, 8))], certified, log)  # 1: a kernel failed
    if certify not in (0, 1):
        print(f"lean_new_signature: {tree}'s certify exited {certify}: its store is timed as certified as far as it "
              f"went; see {log}", file=sys.stderr, flush=True)
    doc = {"sku": sku, "unchecked": str(unchecked), "certified": str(certified), "build_s": round(build_s, 1),
           "certify_s": round(time.perf_counter() - started, 1), "certify_exit": certify, "log": str(log)}
    done.write_text(json.dumps(doc))
    return {**doc, "reused": False}


def _env(tree: Path, store: str) -> dict[str, str]:
    """The environment of a process of `tree`'s fa4_aot on `store`: the local store alone (no server), the default
    certification policy and no trust keys (the stores are unsigned), whatever the caller's environment says."""
    env = {**os.environ, "FA4_AOT_CACHE": store,
           "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)}
    for name in ("FA4_AOT_SERVER", "FA4_AOT_CERTIFIED", "FA4_AOT_TRUSTED_KEYS"):
        env.pop(name, None)
    return env


def one_process(tree: Path, runtime: str, store: str, out: Path) -> dict[str, Any]:
    """One fresh process of `tree`'s fa4_aot running `runtime` over `store`: its document, or {"error": its
    stderr's end} when it failed (the other combinations still run)."""
    env = _env(tree, store)
    out.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", runtime, "--out", str(out)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"lean_new_signature: the {runtime} process of {tree} on {store} failed (exit {done.returncode}):\n"
              f"{done.stderr[-3000:]}", file=sys.stderr, flush=True)
        return {"error": done.stderr[-3000:]}
    doc: dict[str, Any] = json.loads(out.read_text())
    if not doc["fa4_aot"].startswith(str(tree)):  # PYTHONPATH must pick the version measured
        sys.exit(f"lean_new_signature: {tree}'s process imported {doc['fa4_aot']}")
    return doc


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and maxima of the rows' new-signature costs and the collector's pauses in first calls."""
    found: dict[str, Any] = {"signatures": len(rows)}
    if not rows:
        return found
    for part in ("fwd", "bwd"):
        found[f"new_{part}_ms_median"] = round(statistics.median(r[f"new_{part}_ms"] for r in rows), 3)
        found[f"new_{part}_ms_max"] = max(r[f"new_{part}_ms"] for r in rows)
        found[f"first_{part}_gc_ms_total"] = round(sum(r[f"first_{part}_gc_ms"] for r in rows), 3)
        found[f"first_{part}_full_gcs"] = sum(r[f"first_{part}_full_gcs"] for r in rows)
    found["new_ms_sum_of_medians"] = round(found["new_fwd_ms_median"] + found["new_bwd_ms_median"], 3)
    return found


def measure(versions: dict[str, Path], stores: dict[str, dict[str, Any]], rounds: int, work: Path,
            before_runtimes: tuple[str, ...] = ("lean", "fa4")) -> dict[str, Any]:
    """Every (version, runtime, store) once per round, alternated: {combination: {processes, rows, summary}};
    the older version runs only `before_runtimes`."""
    combos = [(v, r, s) for v in versions for r in ("lean", "fa4") if v == "after" or r in before_runtimes
              for s in ("certified", "unchecked")]
    found: dict[str, Any] = {f"{v} {r} {s}": {"processes": [], "rows": []} for v, r, s in combos}
    for n in range(rounds):
        for v, r, s in combos:
            doc = one_process(versions[v], r, stores[v][s], work / "child.json")
            name, rows = f"{v} {r} {s}", doc.get("rows", [])
            found[name]["processes"].append({k: doc[k] for k in ("fa4_aot", "device", "python", "error") if k in doc}
                                            | {"round": n})
            found[name]["rows"] += rows
            print(f"round {n + 1}/{rounds} {name}: {json.dumps(summary(rows))}", file=sys.stderr, flush=True)
    for combo in found.values():
        combo["summary"] = summary(combo["rows"])
    return found


def table(results: dict[str, Any]) -> str:
    head = ("| version runtime store | new fwd ms (median / max) | new bwd ms (median / max) | sum | GC ms in first "
            "fwd+bwd (full collections) |\n| --- | ---: | ---: | ---: | ---: |")
    lines = [head]
    for name, combo in results.items():
        s = combo["summary"]
        if not s["signatures"]:
            lines.append(f"| {name} | every process failed (their errors in the JSON) | | | |")
            continue
        lines.append(f"| {name} | {s['new_fwd_ms_median']:.2f} / {s['new_fwd_ms_max']:.2f} | "
                     f"{s['new_bwd_ms_median']:.2f} / {s['new_bwd_ms_max']:.2f} | {s['new_ms_sum_of_medians']:.2f} | "
                     f"{s['first_fwd_gc_ms_total'] + s['first_bwd_gc_ms_total']:.1f} "
                     f"({s['first_fwd_full_gcs'] + s['first_bwd_full_gcs']}) |")
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the JSON to write (a child: its rows)")
    p.add_argument("--before", type=Path, help="an older checkout of this repository, measured too")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per combination (default 3)")
    p.add_argument("--work", type=Path, help="where the stores are built, kept and reused (default: a fresh "
                                             "temporary folder, removed at the end)")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2, help="build jobs (default: every CPU)")
    p.add_argument("--before-runtimes", default="lean,fa4", help="the runtimes timed for --before (default "
                   "lean,fa4; lean alone when device time is short: FA4 over install() is the same FA4 in both)")
    p.add_argument("--child", choices=("lean", "fa4"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.before is not None and not (args.before / "fa4_aot" / "__init__.py").is_file():
        p.error(f"--before {args.before}: no fa4_aot package there (extract an older checkout into it)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child(args.child, args.out)
    sku = detect_sku()
    work = (args.work or Path(tempfile.mkdtemp(prefix="fa4aot-new-signature-"))).resolve()
    try:
        run(args, sku, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, sku: str, work: Path) -> None:
    versions = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    stores = {v: prepare(sku, tree, work / v, args.jobs) for v, tree in versions.items()}
    results = measure(versions, stores, args.rounds, work, tuple(args.before_runtimes.split(",")))
    doc = {"date": time.strftime("%Y-%m-%d"), "sku": sku, "stores": stores, "rounds": args.rounds,
           "signatures": {"warm_up": WARM_UP, "new": NEW, "batch": BATCH, "seqlen": SEQLEN},
           "versions": {k: str(v) for k, v in versions.items()}, "results": results}
    args.out.write_text(json.dumps(doc, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
