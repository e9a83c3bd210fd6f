"""Reproduce certification findings with FA4 alone: FA4's own JIT (flash_attn.cute, no fa4-aot store, no lean
runtime), each finding in a fresh process, against an independent reference. Whether a `wrong` or `crash` verdict
is FA4's (to report upstream) or fa4-aot's (its store, its loader, its checker) is decided here.

    python bench/repro_findings.py FINDINGS.jsonl OUT.json [--limit N]

FINDINGS.jsonl: one certify journal line per finding ({"check": {...}, "status": ..., ...}), as
bench/certify_findings-h200-2026-12-03.jsonl. Inputs are certification's own (fa4_aot.certify.inputs: pure torch,
the same seed gives the same tensors). For dense calls the reference is written out below (scores, masks, softmax
and autograd in float64: no code shared with fa4_aot.certify.reference), with FA4's tolerance: twice the error of
the same computation in the input precision plus FA4's rounding term; other layouts use certify's reference.
Needs a GPU and the CuTe DSL (FA4 compiles each kernel on first use: seconds to a minute a finding).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, torch
from fa4_aot.certify.inputs import make_inputs
from fa4_aot.domain.signature import Signature

finding = json.loads(sys.argv[1])
check = finding["check"]
sig = Signature.from_dict(check["sig"])
inputs = make_inputs(sig, check["point"], check["seed"], "cuda")
t = inputs.tensors
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func  # FA4's JIT: nothing of fa4-aot's store
fn = flash_attn_func if sig.layout == "dense" else flash_attn_varlen_func
kwargs = inputs.kwargs()
if sig.layout == "dense":
    kwargs = {k: v for k, v in kwargs.items() if k not in ("max_seqlen_q", "max_seqlen_k")}
result = fn(t["q"], t["k"], t["v"], **kwargs)
out = result[0] if isinstance(result, tuple) else result
torch.cuda.synchronize()
grads = {}
wrt = {n: t[s] for n, s in (("dq", "q"), ("dk", "k"), ("dv", "v")) if t[s].requires_grad}
if inputs.dout is not None:
    grads = dict(zip(wrt, torch.autograd.grad(out, list(wrt.values()), inputs.dout)))
    torch.cuda.synchronize()
got = {"out": out.detach(), **grads}


def naive(dtype):
    # attention as FA4 defines it (bottom-right masks), in `dtype`, softmax in float64 when dtype is float64
    q, k, v = (t[n].detach().to(dtype).requires_grad_(inputs.dout is not None) for n in ("q", "k", "v"))
    hq, hk = q.shape[2], k.shape[2]
    kk, vv = (x.repeat_interleave(hq // hk, dim=2) for x in (k, v))
    scale = sig.head_dim ** -0.5
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if sig.softcap:
        s = torch.tanh(s / sig.softcap) * sig.softcap
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if sig.mask == "causal":
        allowed = j <= i
    elif sig.mask == "local":
        left, right = sig.window
        allowed = (j >= i - left) & (j <= i + right)
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s.to(torch.float64 if dtype == torch.float64 else torch.float32), dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p.to(dtype), vv)
    res = {"out": o.detach()}
    if inputs.dout is not None:
        gs = torch.autograd.grad(o, [q, k, v], inputs.dout.to(dtype))
        res.update(dict(zip(("dq", "dk", "dv"), (g.detach() for g in gs))))
    return res


report = {"layout": sig.layout, "tensors": {}}
if sig.layout == "dense":
    ref, low = naive(torch.float64), naive(inputs.dtype)
    for name, mine in got.items():
        r = ref[name]
        atol = 2 * float(((r.to(inputs.dtype) + 0.3) - 0.3 - r.to(inputs.dtype)).abs().max())
        own = float((low[name].double() - r).abs().max())
        err = float((mine.double() - r).abs().max())
        bound = 2 * own + atol
        report["tensors"][name] = {"error": err, "bound": bound, "ratio": err / bound if bound else None,
                                   "ref_max": float(r.abs().max()), "verdict": "pass" if err <= bound else "wrong"}
else:
    from fa4_aot.certify import reference
    outs = reference.Outputs(out=got["out"], **{k: v for k, v in grads.items()})
    fails = reference.compare(outs, reference.reference(inputs, sig, dtype=torch.float32),
                              reference.reference(inputs, sig, dtype=inputs.dtype))
    report["tensors"] = {f.tensor: {"error": f.error, "bound": f.bound, "verdict": "wrong"} for f in fails}
report["status"] = "wrong" if any(v["verdict"] == "wrong" for v in report["tensors"].values()) else "pass"
print(json.dumps(report))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("findings", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    findings = [json.loads(line) for line in args.findings.read_text().splitlines() if line.strip()]
    seen, rows = set(), []
    for finding in findings:
        key = json.dumps(finding["check"], sort_keys=True)
        if key in seen or (args.limit and len(rows) >= args.limit):
            continue
        seen.add(key)
        started = time.time()
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(finding)], capture_output=True,
                                  text=True, timeout=args.timeout)
            if done.returncode == 0:
                fa4 = json.loads(done.stdout.strip().splitlines()[-1])
            else:
                fa4 = {"status": "crash", "detail": done.stderr.strip().splitlines()[-1][:300] if done.stderr else ""}
        except subprocess.TimeoutExpired:
            fa4 = {"status": "hang", "detail": f"no answer in {args.timeout} s"}
        row = {"check": finding["check"], "certify": finding["status"], "certify_failures": finding.get("failures"),
               "fa4_jit": fa4, "seconds": round(time.time() - started, 1)}
        rows.append(row)
        print(json.dumps({"certify": row["certify"], "fa4_jit": fa4.get("status"),
                          "check": {**finding["check"]["sig"], **finding["check"]["point"]}}), flush=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
