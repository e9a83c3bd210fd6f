"""A lean miss builds its call's whole signature (issue 30, point 2: compile/rebuild.py), and only its own call is
judged for it: a known-bad kernel the signature launches at other sizes refuses those sizes, not the miss, which
ends done with its call served, the rest named among the report's lean failures. Real FA4 planning and compiles
on this CPU host (a small causal forward signature: seconds a kernel)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.compile.builder import outcome_of
from fa4_aot.compile.executors import LocalExecutor
from fa4_aot.compile.rebuild import build_misses, served
from fa4_aot.domain import known_bad
from fa4_aot.domain.misses import Miss
from fa4_aot.domain.signature import Signature
from fa4_aot.matrix import variants
from fa4_aot.store import Store
from tests.conftest import TINY_VARIANTS
from tests.helpers.builders import SKU, tiny

pytestmark = pytest.mark.slow
MATRIX = variants.load(TINY_VARIANTS)


@pytest.fixture
def executor() -> Iterator[LocalExecutor]:
    ex = LocalExecutor(1)
    yield ex
    ex.close()


def _kernels(ex: LocalExecutor, store: Store, item: Any) -> set[str]:
    [(_i, out)] = list(ex.plan(SKU, store, [[("x", item)]], record=False))
    return {k.kernel_key for k in out.kernels}


def test_i30_2_a_known_bad_kernel_of_other_sizes_does_not_reject_a_lean_miss(executor: LocalExecutor,
                                                                             tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    call = tiny(batch=2, mask="causal", heads_q=14, heads_kv=2)  # qwen2.5-0.5b's prefill: 1 of its kernels
    own, whole = _kernels(executor, store, call), _kernels(executor, store, Signature.of(call))
    others = sorted(whole - own)
    assert own and others, "the signature must launch kernels the call does not, or this proves nothing"
    entry = {"id": "measured-other-size", "when": {"head_dim": 64}, "kernel_keys": [others[0]], "sku": ["h200"],
             "symptom": "wrong output (test)", "source": "fa4-aot certify (test)"}
    store.put_known_bad("h200", known_bad.measured_document([known_bad.parse_entry(entry, "test")]))
    miss = Miss.lean(call, "h200")
    reports = build_misses(MATRIX, store, [miss], executor=executor)
    outcome = outcome_of(reports, "h200")
    assert outcome.status == "done" and outcome.built >= len(own), (outcome, reports[0].refused)
    assert served(store, SKU, call)
    assert any("measured-other-size" in f for f in reports[0].lean_failures), reports[0].lean_failures
