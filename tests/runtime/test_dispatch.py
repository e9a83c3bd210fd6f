"""The lean runtime's dispatch decision is FA4's own: on about five thousand random sizes (and, for a quarter of
them, KV head counts other than the signature's at its GQA ratio: issue 17) across nineteen
signatures (dense, varlen, seqused and paged KV decode, GQA, causal/local/full, softcap and sink, deterministic
backward, split-KV by heuristic and by count with FA4's combine kernel, on the H200 and the B200), the recorded
region whose guards hold, evaluated at the sizes, equals step for step what FA4 does when run at exactly those
sizes on fake tensors: the same kernels (compile keys), the same launch arguments, the same allocations with
the same shapes, the same zero fills (tests/runtime/dispatch_probe.py). For seqused and paged calls FA4's run
mostly gets max_seqlen_q/k as None where the sizes hold its defaults, as the lean runtime fills them in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SAMPLES = int(os.environ.get("FA4_AOT_DISPATCH_SAMPLES", "255"))  # per signature


def _sig(layout: str, pass_: str, d: int, mask: str, hq: int, hkv: int, **extra: object) -> dict:
    sig = {"layout": layout, "pass_": pass_, "dtype": "bf16", "head_dim": d, "head_dim_v": d, "mask": mask,
           "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "heads_q": hq, "heads_kv": hkv}
    return {**sig, **extra}


GROUPS = [  # (SKU, signatures): one probe process each
    ("h200", [_sig("dense", "bwd", 128, "causal", 8, 2), _sig("dense", "fwd", 64, "local", 8, 8, window=[256, 0]),
              _sig("varlen", "bwd", 128, "full", 8, 2), _sig("dense", "fwd", 128, "causal", 32, 8, num_splits=0)]),
    ("h200", [_sig("dense", "bwd_det", 128, "causal", 16, 16, dtype="fp16", softcap=30.0, sink=True),
              _sig("dense", "fwd_lse", 256, "full", 4, 1), _sig("varlen", "fwd", 192, "causal", 8, 8, head_dim_v=128),
              _sig("varlen", "fwd_lse", 128, "full", 32, 8, num_splits=3)]),
    ("h200", [_sig("seqused", "fwd", 128, "causal", 32, 8), _sig("paged", "fwd", 128, "causal", 32, 8, page_size=16),
              _sig("paged", "fwd_lse", 64, "full", 8, 8, page_size=128, num_splits=0),
              _sig("seqused", "bwd", 128, "full", 8, 2, softcap=20.0, sink=True),
              _sig("varlen", "bwd", 128, "causal", 8, 2, sink=True)]),
    ("b200", [_sig("dense", "fwd", 128, "causal", 32, 8, num_splits=0),
              _sig("varlen", "fwd_lse", 128, "full", 16, 4, num_splits=4),
              _sig("paged", "fwd", 128, "causal", 32, 8, page_size=128, num_splits=0),
              _sig("seqused", "fwd", 192, "local", 16, 16, head_dim_v=128, window=[128, 0], num_splits=0),
              _sig("paged", "fwd_lse", 64, "full", 8, 1, dtype="fp16", sink=True, page_size=64, num_splits=3),
              _sig("dense", "bwd", 128, "causal", 8, 2)]),
]


def test_lean_dispatch_matches_fa4_on_random_sizes() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probes = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "runtime" / "dispatch_probe.py"), sku,
                                json.dumps(group), str(SAMPLES), str(seed)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
              for seed, (sku, group) in enumerate(GROUPS)]
    reports = []
    for probe in probes:
        out, err = probe.communicate(timeout=3600)
        assert probe.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    compared = sum(r["compared"] for r in reports)
    recorded = sum(r["recorded"] for r in reports)
    split, refused = sum(r["split"] for r in reports), sum(r["refused"] for r in reports)
    print(f"dispatch: {compared} random sizes compared with FA4, {recorded} regions recorded, {split} split-KV, "
          f"{refused} rejected by FA4 and by the lean runtime alike")
    assert compared == SAMPLES * sum(len(g) for _sku, g in GROUPS)
    assert refused < compared / 20  # FA4 rejects few calls (seqused backward above its binary-search batch)
    assert split > compared / 20  # split-KV with the combine kernel is exercised, not only chosen against
    assert [m for r in reports for m in r["mismatches"]] == []
    assert recorded < compared / 5  # regions generalise: most sizes fall in a region recorded elsewhere
