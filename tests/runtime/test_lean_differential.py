"""Issue 17: the lean runtime launches what FA4 launches, for random calls of every signature class it serves.

For each class (layout dense, varlen, seqused or paged at page sizes 1 to 128; pass fwd, fwd with LSE, fwd+bwd
or deterministic fwd+bwd, paged forward only; mask full, causal or local with a random window, spelled as
callers spell it, causal=True with a window included; softcap; learnable sink; GQA ratios 1 to 32 over 1 to 16
KV heads; head dims 64 to 256; bf16 and fp16; num_splits 1 or 0), random calls with random sizes (windows shorter
and longer than the sequence, default or given softmax_scale, FA4's default or given max lengths) go through the
lean runtime's real entry points and through FA4's own on the same fake CUDA tensors, in fresh processes
configured for the H200 (tests/runtime/differential_probe.py). The lean runtime reads a temp store holding the
regions a build records for the signatures it asks for; each must launch FA4's kernels (kernel keys), in FA4's
order, with FA4's arguments (every scalar: window sizes, softcap, scale, lengths, grid and split decisions; every
tensor's shape, stride and dtype), and return outputs and gradients of FA4's shapes, strides and dtypes. Sizes are
drawn over the whole range the build covers (batch up to 22k, seqlen_q up to 256k, seqlen_k up to 1M, not only
near the sizes the planner probes), and every call must fall inside a region the build recorded (a call outside
every region raises KernelMissing before any launch; it is counted, recorded as `build --from-misses` would,
compared, and fails the test). A forward, with or without LSE, is half the time served by a build for training.
The training passes drive both autograd Functions' forward and backward directly (autograd on fake CUDA tensors
aborts a CPU-only process); torch's autograd engine itself is not exercised.

Seeded: FA4_AOT_DIFFERENTIAL_SEED (default 17) draws the classes and calls, FA4_AOT_DIFFERENTIAL_CALLS (default
60) sets the calls per class; a failure prints the seed, the class and the call.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from tests.conftest import ROOT

SEED = int(os.environ.get("FA4_AOT_DIFFERENTIAL_SEED", "17"))
CALLS = int(os.environ.get("FA4_AOT_DIFFERENTIAL_CALLS", "60"))
PROCESSES = 2
LAYOUTS = {"dense": ("fwd", "fwd_lse", "bwd", "bwd_det"), "varlen": ("fwd", "fwd_lse", "bwd", "bwd_det"),
           "seqused": ("fwd", "fwd_lse", "bwd", "bwd_det"), "paged": ("fwd", "fwd_lse")}
HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (128, 128), (192, 128), (192, 192), (256, 256), (80, 80)]


def classes(seed: int, calls: int) -> list[dict[str, Any]]:
    """One class per layout, pass and mask, the rest of the signature drawn at random."""
    rng = random.Random(seed)
    found = []
    for layout, passes in LAYOUTS.items():
        for pass_ in passes:
            for mask in ("full", "causal", "local"):
                found.append(_draw(rng, layout, pass_, mask, index=len(found), calls=calls))
    for cls in found:  # a forward without LSE served by a build for training (its own draw: the classes stay put)
        if cls["pass_"] == "fwd" and cls["layout"] != "paged":
            cls["built_as"] = random.Random(f"{seed}:{cls['index']}").choice([None, "bwd"])
    return found


def _draw(rng: random.Random, layout: str, pass_: str, mask: str, **extra: Any) -> dict[str, Any]:
    kv_heads = sorted(rng.sample([1, 2, 4, 8, 16], 2))  # head counts of one GQA ratio share a recipe file
    d, dv = rng.choice(HEAD_DIMS)
    left = rng.choice([rng.randint(0, 300), rng.randint(1, 8192)])
    right = rng.choice([0, 0, rng.randint(0, 1024)])
    return {"layout": layout, "page_size": rng.choice([1, 16, 64, 128]) if layout == "paged" else 0,
            "dtype": rng.choice(["bf16", "bf16", "fp16"]), "head_dim": d, "head_dim_v": dv,
            "kv_heads": kv_heads, "ratio": rng.randint(1, 32), "mask": mask,
            "window": [left, right] if mask == "local" else [0, 0],
            "softcap": rng.choice([0.0, 0.0, float(rng.choice([15, 30, 50]))]), "sink": rng.random() < 0.35,
            "pass_": pass_, "num_splits": rng.choice([1, 0]),
            # a forward with LSE served by a build for training, half the time
            "built_as": rng.choice([None, "bwd"]) if pass_ == "fwd_lse" else None, **extra}


_KINDS = ["wrong launch", "wrong result layout", "lean refuses a call FA4 runs", "other"]


def _kind(why: str) -> str:
    """A mismatch's kind: the worst (a wrong launch: wrong numbers on a GPU) first."""
    if why.startswith(("kernels ", "launch ")):
        return "wrong launch"
    if why.split(":")[0] in ("out", "lse", "dq", "dk", "dv", "dlearnable_sink"):
        return "wrong result layout"
    return "lean refuses a call FA4 runs" if why.startswith(("lean raises", "recording fails")) else "other"


def _probe(group: list[dict[str, Any]]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "runtime" / "differential_probe.py"), "h200",
                             str(SEED), json.dumps(group)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_lean_launches_equal_fa4_on_random_calls() -> None:
    drawn = classes(SEED, CALLS)
    started = time.monotonic()
    probes = [_probe(drawn[i::PROCESSES]) for i in range(PROCESSES)]
    reports = []
    try:
        for probe in probes:
            out, err = probe.communicate(timeout=3600)
            assert probe.returncode == 0, err[-3000:]
            reports += json.loads(out.strip().splitlines()[-1])
    finally:  # a probe left running (a timeout, a failed one) would go on exploring for nobody
        for probe in probes:
            if probe.poll() is None:
                probe.kill()
                probe.wait()
    total = {k: sum(r[k] for r in reports) for k in ("compared", "outside", "rejected", "shorter")}
    print(f"seed {SEED}: {len(drawn)} classes x {CALLS} calls; {total['compared']} compared with FA4 "
          f"({total['shorter']} with a window shorter than the sequence), {total['outside']} outside every recorded "
          f"region (KernelMissing, then recorded and compared), {total['rejected']} rejected by FA4 and the lean "
          f"runtime alike; {time.monotonic() - started:.0f} s; slowest classes (s): "
          f"{sorted(((r['seconds'], r['index']) for r in reports), reverse=True)[:6]}")
    found = sorted((m for r in reports for m in r["mismatches"]), key=lambda m: _KINDS.index(_kind(m["why"])))
    counts = {k: n for k in _KINDS if (n := sum(_kind(m["why"]) == k for m in found))}
    assert found == [], f"seed {SEED}: {len(found)} call(s) where the lean runtime differs from FA4 ({counts}):\n" + \
        "\n".join(f"class {drawn[m['call']['class']]}:\n  call {json.dumps(m['call'])}\n  {m['why']}"
                  for m in found[:12])
    assert total["compared"] + total["rejected"] == len(drawn) * CALLS
    assert total["rejected"] < total["compared"] / 10, "FA4 rejects most calls: the test compares little"
    outside = [c for r in reports for c in r.get("outside_calls", [])]
    assert total["outside"] == 0, (
        f"seed {SEED}: {total['outside']} call(s) fell outside every region a build records: the regions do not "
        "cover the whole size space, e.g.\n" + "\n".join(
            f"class {drawn[c['class']]}:\n  sizes {c['sizes']} shapes {c['shapes']}" for c in outside[:8]))
    assert total["shorter"] > total["compared"] / 20, "windows shorter than the sequence are not exercised"


def test_classes_cover_every_axis() -> None:
    drawn = classes(SEED, CALLS)
    assert {(c["layout"], c["pass_"], c["mask"]) for c in drawn} == {
        (layout, p, m) for layout, passes in LAYOUTS.items() for p in passes for m in ("full", "causal", "local")}
    assert {c["page_size"] for c in drawn if c["layout"] == "paged"} <= {1, 16, 64, 128}
    assert any(c["softcap"] for c in drawn) and any(c["sink"] for c in drawn)
    assert {c["num_splits"] for c in drawn} == {0, 1}
    assert max(c["ratio"] for c in drawn) > 16 and min(c["ratio"] for c in drawn) <= 2
    assert {c["pass_"] for c in drawn if c["built_as"]} == {"fwd", "fwd_lse"}
    assert any(c["mask"] == "local" and c["window"][1] == 0 for c in drawn)  # causal=True with a window
