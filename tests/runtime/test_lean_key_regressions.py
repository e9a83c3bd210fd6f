"""Regressions (issue 29, part 1): the lean runtime keyed its recipes on values FA4 passes to its kernels at run time.

Measured on the H200 over the default h200 build: ten paged decode calls at page size 1 (yi-34b, internlm2-20b,
gpt-j-6b, ...) raised "no recorded recipe of Signature(layout='paged', ..., page_size=1)" where FA4 over install()
ran them with the kernels built for other page sizes; a training call with window (1023, 0) (heads 48/4, head dim
128, s 8192) was missed where the build's recipes named the window (4095, 0). FA4's compile key holds neither the
page size nor the window sizes (only `page_table is not None`, `window_size_left is not None`, ... and the
decisions its host code derives from them, e.g. `paged_kv_tma = page_size == tile_n`), so one build serves them all.

Each test builds some signatures once (tests/runtime/key_probe.py, in a fresh process configured for the H200) and
calls at values the build did not name: the lean runtime and FA4 over the same build must give the same verdict
(served, missing, rejected) and, where served, launch the same kernels with the same arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT

SEED = int(os.environ.get("FA4_AOT_DIFFERENTIAL_SEED", "17"))


def _cls(**values: Any) -> dict[str, Any]:
    base = {"layout": "dense", "page_size": 0, "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "kv_heads": [4],
            "ratio": 12, "mask": "causal", "window": [0, 0], "softcap": 0.0, "sink": False, "pass_": "fwd",
            "num_splits": 1, "built_as": None, "index": 0}
    return {**base, **values}


def _probe(built: list[dict[str, Any]], calls: list[tuple[dict[str, Any], int]]) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "runtime" / "key_probe.py"), "h200", str(SEED),
                           json.dumps({"built": built, "calls": calls})], capture_output=True, text=True, cwd=ROOT,
                          timeout=3000, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(found: list[dict[str, Any]]) -> None:
    wrong = [f for f in found if f["why"]]
    assert wrong == [], f"seed {SEED}: {len(wrong)} of {len(found)} call(s) differ:\n" + "\n".join(
        f"  {json.dumps(f['call'])[:600]}\n    {f['why'][:800]}" for f in wrong[:8])
    served = sum(f["fa4"] == "served" for f in found)
    assert served > len(found) / 2, f"FA4 serves only {served} of {len(found)} calls: the test compares little"
    _same_keys_same_file(found)


def _same_keys_same_file(found: list[dict[str, Any]]) -> None:
    """Over every pair of calls FA4 runs: the same kernels launched (FA4's compile keys) <=> the same recipe file
    and, where both are served, one region holds for both only if they launch the same kernels. The lean runtime
    tells calls apart no finer than FA4 (a file per set of compile keys at most) and never coarser (a region is
    FA4's one choice)."""
    ran = [f for f in found if f["kernels"] is not None]
    for a in ran:
        for b in ran:
            if a["kernels"] == b["kernels"]:
                assert a["file"] == b["file"], \
                    f"one set of FA4 kernels, two recipe files:\n  {a['call']}\n  {b['call']}"
            if a["file"] == b["file"] and a["region"] is not None and a["region"] == b["region"]:
                assert a["kernels"] == b["kernels"], f"one region, two FA4 choices:\n  {a['call']}\n  {b['call']}"


def test_lean_paged_page_size_1_served_like_fa4() -> None:
    """Paged decode built at page sizes 16 and 128 (the TMA path: page size == FA4's tile_n), called at 1, 2, 16,
    64, 128 and 256."""
    paged = _cls(layout="paged", kv_heads=[8, 2], ratio=7)  # built at 8 KV heads, called at 8 and 2
    built = [{**paged, "page_size": 16}, {**paged, "page_size": 128}]
    calls = [({**paged, "page_size": page, "index": i}, 5) for i, page in enumerate((1, 2, 16, 64, 128, 256))]
    found = _probe(built, calls)
    _check(found)
    assert any(f["lean"] == "served" for f in found if f["call"]["shapes"]["k"][1] == 1)


def test_lean_window_not_planned_served_like_fa4() -> None:
    """A training signature built with the window (4095, 0), called (forward and backward) at other windows,
    shorter and longer than the sequence, with a right side too."""
    local = _cls(mask="local", window=[4095, 0], pass_="bwd", kv_heads=[4, 1])  # built at 4 KV heads
    windows = ((1023, 0), (4095, 0), (0, 0), (127, 0), (8191, 0), (300000, 0), (511, 511), (1023, 64))
    calls = [({**local, "window": list(w), "index": i}, 4) for i, w in enumerate(windows)]
    found = _probe([local], calls)
    _check(found)
    assert any(f["lean"] == "served" for f in found if f["call"]["window"] == [1023, 0])
