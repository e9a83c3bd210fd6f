"""Regression (issue 17): sliding-window attention on the lean runtime was wrong whenever the window was shorter
than the sequence (H200, causal=True with window_size=(4095, 0) at 8192 tokens: rel. error 0.20; FA4 over the
same store: 0.0021). runtime.api.signature read causal=True as the causal mask and dropped the window, so the
lean runtime replayed FA4's causal kernel with no window; FA4 reads causal=True with a window as a local
window whose right side is 0 (interface._resolve_causal_local_window). A window at least as long as the
sequence masks nothing more than causal does, which is why s=4096 with (4095, 0) came out exact.

The check is differential and runs on the CPU: the lean runtime's flash_attn_func and FA4's own, on the same
fake CUDA tensors with the same arguments, must launch the same kernels (kernel keys) with the same arguments
(window sizes, every scalar, every tensor's shape, stride and dtype), in the same order
(tests/runtime/window_probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fa4_aot.runtime import api
from tests.conftest import ROOT


def _call(batch: int, sq: int, sk: int, hq: int, hkv: int, d: int, causal: bool, window: tuple[int, int],
          return_lse: bool = False) -> dict:
    return {"q": [batch, sq, hq, d], "k": [batch, sk, hkv, d], "causal": causal, "window_size": list(window),
            "return_lse": return_lse}


CALLS = [
    _call(1, 8192, 8192, 48, 4, 128, True, (4095, 0)),  # issue 17 as reported
    _call(1, 6000, 6000, 24, 2, 128, True, (1023, 0)),
    _call(1, 6000, 6000, 12, 1, 128, True, (1023, 0), return_lse=True),
    _call(1, 512, 4096, 32, 8, 128, True, (1023, 0)),  # a chunk of queries over a longer cache
    _call(1, 5000, 5000, 8, 2, 128, True, (1023, 64)),  # FA4 sets the right side of a causal window to 0
    _call(1, 4096, 4096, 48, 4, 128, True, (4095, 0)),  # windows at least as long as the sequence
    _call(2, 1000, 1000, 8, 8, 64, True, (4095, 0)),
    _call(1, 4096, 4096, 16, 2, 128, False, (255, 0)),  # non-causal local windows
    _call(1, 3000, 3000, 32, 8, 128, False, (511, 511), return_lse=True),
    _call(1, 1000, 1000, 8, 1, 128, False, (4096, 4096)),
    _call(1, 2048, 2048, 8, 2, 128, True, (-1, -1)),  # FA2's "no window": FA4 reads it as none
    _call(1, 2048, 2048, 8, 2, 128, False, (-1, -1)),
]


def _difference(lean: list, fa4: list) -> str:
    """The kernels where they differ, and the first argument that differs."""
    found = []
    if [key for key, _args in lean] != [key for key, _args in fa4]:
        found.append(f"kernels {[k[:12] for k, _a in lean]} where FA4 launches {[k[:12] for k, _a in fa4]}")
    for i, ((_key, mine), (_k, theirs)) in enumerate(zip(lean, fa4, strict=False)):
        differ = [j for j, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b]
        if differ or len(mine) != len(theirs):
            j = differ[0] if differ else min(len(mine), len(theirs))
            found.append(f"launch {i} argument {j}: {mine[j:j + 1]} where FA4 passes {theirs[j:j + 1]}")
            break
    return "; ".join(found) or "launch counts differ"


def test_lean_sliding_window_shorter_than_sequence_matches_fa4() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "runtime" / "window_probe.py"), "h200",
                           json.dumps(CALLS)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(f["fa4"] for f in found), "FA4 launched nothing: the probe compares nothing"
    mismatches = [f"{call}: {_difference(f['lean'], f['fa4'])}"
                  for call, f in zip(CALLS, found, strict=True) if f["lean"] != f["fa4"]]
    assert mismatches == [], "\n".join(mismatches)


@pytest.mark.parametrize("causal,window,mask,recorded", [
    (True, (4095, 0), "local", (4095, 0)), (True, (1023, 64), "local", (1023, 0)),
    (False, (255, 0), "local", (255, 0)), (False, (511, 511), "local", (511, 511)),
    (True, (None, None), "causal", (0, 0)), (False, (None, 0), "causal", (0, 0)),
    (True, (-1, -1), "causal", (0, 0)), (False, (-1, -1), "full", (0, 0)), (False, (None, None), "full", (0, 0)),
])
def test_causal_and_window_are_read_as_fa4_reads_them(causal: bool, window: tuple, mask: str,
                                                      recorded: tuple) -> None:
    sig = api.signature("dense", "torch.bfloat16", 48, 128, 4, 128, causal=causal, window_size=window)
    assert (sig.mask, sig.window) == (mask, recorded)
