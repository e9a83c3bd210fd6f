"""Regression (issue 17, item 2 "Parity"): the lean runtime served no call of FA4's test grid although
`install()` served them from the same store. (a) Recipe files were keyed by both head counts, which FA4's kernels
do not depend on (FA4's test-grid signature with 6 query and 6 KV heads at head dim 64, causal, missed while MHA
at head dim 64 was built at other head counts); now a file is keyed by the GQA ratio and the KV head count is a
size of its regions, every FA4 choice on it a guard (recipe format 2). (c) A forward-only call missed where its
training signature's recipe exists; FA4 runs a training call's forward (LSE computed) for a call that returns
LSE without grad, and for any call whose inputs require grad, in no_grad too, so such calls are now served by the
training recipe's forward steps. A forward without LSE is not: FA4 compiles another kernel for it.

The check is differential on the CPU (tests/runtime/parity_probe.py): the lean runtime's flash_attn_func over a store
holding only the region recorded for other head counts (or for the training pass), and FA4's own
flash_attn_func, on the same fake CUDA tensors, must launch the same kernels with the same arguments. Where FA4's
choices change with the head count (the split heuristic, pack_gqa for head dim 256 on the B200) the lean runtime
must miss instead (KernelMissing), never launch something else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.runtime.test_lean_window_regression import _difference

SERVED, EITHER, MISSED = "served", "served or missed", "missed"


def _call(batch: int, sq: int, sk: int, heads: tuple[int, int], d: int, expect: str, record: dict[str, Any],
          requires_grad: bool = False, **kwargs: Any) -> dict[str, Any]:
    hq, hkv = heads
    return {"q": [batch, sq, hq, d], "k": [batch, sk, hkv, d], "kwargs": kwargs, "record": record,
            "requires_grad": requires_grad, "expect": expect}


HEADS = [  # (SKU, calls): a region recorded at one head count serves the other head counts of its GQA ratio
    ("h200", [
        _call(2, 1000, 1000, (6, 6), 64, SERVED, {"heads": [16, 16]}, causal=True),  # issue 17 as reported
        _call(2, 1000, 1000, (32, 32), 64, SERVED, {"heads": [16, 16]}, causal=True),
        _call(2, 1000, 1000, (2, 2), 64, SERVED, {"heads": [16, 16]}, causal=True),
        _call(2, 1000, 1000, (1, 1), 64, EITHER, {"heads": [16, 16]}, causal=True),
        _call(1, 3000, 3000, (32, 8), 128, SERVED, {"heads": [16, 4]}, causal=True),
        _call(1, 3000, 3000, (64, 16), 128, SERVED, {"heads": [16, 4]}, causal=True),
        _call(1, 3000, 3000, (8, 2), 128, SERVED, {"heads": [16, 4]}, causal=True),
        _call(1, 3000, 3000, (4, 1), 128, EITHER, {"heads": [16, 4]}, causal=True),
        _call(2, 700, 900, (48, 6), 128, SERVED, {"heads": [24, 3]}, return_lse=True),
        _call(1, 5000, 5000, (24, 2), 128, SERVED, {"heads": [48, 4]}, causal=True, window_size=[1023, 0]),
        _call(1, 2048, 2048, (64, 8), 64, SERVED, {"heads": [16, 2]}, causal=True, softcap=30.0),
        # the split heuristic reads the KV head count: FA4's choice changes, so a region may not hold
        _call(1, 1, 4096, (32, 8), 128, EITHER, {"heads": [8, 2]}, causal=True, num_splits=0),
        _call(4, 1, 8192, (4, 1), 128, EITHER, {"heads": [64, 16]}, causal=True, num_splits=0),
        _call(1, 1, 4096, (8, 1), 128, EITHER, {"heads": [16, 2]}, num_splits=0),
    ]),
    ("b200", [  # head dim 256: pack_gqa depends on 2 * batch * heads <= SMs where 128 % ratio != 0
        _call(1, 100, 100, (6, 2), 256, SERVED, {"heads": [12, 4]}, causal=True),
        _call(1, 100, 100, (240, 80), 256, EITHER, {"heads": [6, 2]}, causal=True),
        _call(1, 100, 100, (6, 2), 256, EITHER, {"heads": [240, 80]}, causal=True),
        _call(2, 2000, 2000, (32, 8), 128, SERVED, {"heads": [8, 2]}, causal=True),
        _call(1, 1, 8192, (32, 8), 128, EITHER, {"heads": [64, 16]}, causal=True, num_splits=0),
    ]),
]

FORWARD_ONLY = [  # (SKU, calls): the store holds only the training signature's recipe
    ("h200", [
        _call(2, 1000, 1000, (8, 2), 128, SERVED, {"pass_": "bwd"}, causal=True, return_lse=True),
        _call(2, 1000, 1000, (8, 2), 128, SERVED, {"pass_": "bwd_det"}, causal=True, return_lse=True),
        _call(2, 1000, 1000, (8, 2), 128, SERVED, {"pass_": "bwd"}, requires_grad=True, causal=True),
        _call(1, 3000, 3000, (32, 8), 64, SERVED, {"pass_": "bwd", "heads": [8, 2]}, causal=True, return_lse=True),
        _call(1, 4096, 4096, (16, 2), 128, SERVED, {"pass_": "bwd"}, requires_grad=True, window_size=[255, 0]),
        # without LSE FA4 launches another kernel than training's forward: a miss, never the training kernel
        _call(2, 1000, 1000, (8, 2), 128, MISSED, {"pass_": "bwd"}, causal=True),
    ]),
]


def _probe(groups: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = str(ROOT / "tests" / "runtime" / "parity_probe.py")
    probes = [subprocess.Popen([sys.executable, probe, sku, json.dumps(calls)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
              for sku, calls in groups]
    found = []
    for probe, (_sku, calls) in zip(probes, groups, strict=True):
        out, err = probe.communicate(timeout=900)
        assert probe.returncode == 0, err[-3000:]
        found += zip(calls, json.loads(out.strip().splitlines()[-1]), strict=True)
    assert all(f["fa4"] for _c, f in found), "FA4 launched nothing: the probe compares nothing"
    return found


def _problems(found: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """Every call where the lean runtime launched other than FA4, or missed/served against its expectation."""
    problems = []
    for call, f in found:
        where = f"{call['q']} / {call['k']} {call['kwargs']} (recorded {call['record']})"
        missed = isinstance(f["lean"], dict)
        if not missed and f["lean"] != f["fa4"]:
            problems.append(f"{where}: WRONG LAUNCH: {_difference(f['lean'], f['fa4'])}")
        elif missed and call["expect"] == SERVED:
            problems.append(f"{where}: missed: {f['lean']['miss']}")
        elif not missed and call["expect"] == MISSED:
            problems.append(f"{where}: served, expected a miss")
    return problems


def test_lean_serves_other_head_counts_at_a_recorded_gqa_ratio_like_fa4() -> None:
    found = _probe(HEADS)
    assert _problems(found) == []
    print(f"head counts: {sum(not isinstance(f['lean'], dict) for _c, f in found)} of {len(found)} calls served "
          "from a region recorded at other head counts, launch for launch FA4's")


def test_lean_forward_only_call_is_served_by_the_training_recipe() -> None:
    assert _problems(_probe(FORWARD_ONLY)) == []


@pytest.mark.parametrize("requires_grad,grad,return_lse,pass_", [
    (False, True, False, "fwd"), (False, True, True, "fwd_lse"), (True, False, False, "fwd_lse"),
    (True, False, True, "fwd_lse"), (True, True, False, "bwd"),
])
def test_pass_is_the_one_fa4_runs(requires_grad: bool, grad: bool, return_lse: bool, pass_: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """FA4 computes LSE whenever an input requires grad, with grad enabled or not (interface._flash_attn_fwd)."""
    import torch

    from fa4_aot.runtime import api, runner

    asked: list[Any] = []

    class Asked:
        def attention(self, sig: Any) -> None:
            asked.append(sig)

    monkeypatch.setattr(runner, "runtime", lambda cache_dir=None: Asked())
    monkeypatch.setattr(api, "_cache", {})
    q = torch.empty(1, 8, 4, 64, dtype=torch.bfloat16, requires_grad=requires_grad)
    with torch.set_grad_enabled(grad):
        api._attention("dense", q, q, q, True, (None, None), 0.0, None, 1, False, return_lse)
    assert asked[0].pass_ == pass_
