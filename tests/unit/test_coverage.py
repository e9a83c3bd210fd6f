"""coverage.judge as a table: what the store holds against what FA4's dispatch picks per call."""

from __future__ import annotations

import pytest

from fa4_aot import coverage
from tests.unit.test_record import CALL

A, B, C = ("_flash_attn_fwd", "a" * 64), ("_flash_attn_bwd", "b" * 64), ("_bwd_preprocess", "c" * 64)


@pytest.mark.parametrize("planned,stored,served,missing,errors", [
    ([([A, B], "")], {A[1], B[1]}, True, [], 0),
    ([([A, B], "")], {A[1]}, False, [B], 0),
    ([([A, B], ""), ([B, C], "")], set(), False, [A, B, C], 0),  # each kernel listed once, in first-seen order
    ([([], "ValueError: head_dim 512 not supported")], set(), False, [], 1),  # FA4 rejects: never served
    ([([A], ""), ([], "RuntimeError: x")], {A[1]}, False, [], 1),
])
def test_judge(planned, stored, served, missing, errors) -> None:
    calls = [CALL] * len(planned)
    v = coverage.judge("x", calls, planned, stored.__contains__, fix="fa4-aot build --sku h200 --calls f")
    assert (v.served, v.missing, len(v.errors)) == (served, missing, errors)
    doc = v.to_dict()
    assert doc["served"] == served and doc["fix"] == ("" if served else "fa4-aot build --sku h200 --calls f")
    assert doc["items"] == [CALL.to_dict()] * len(planned)  # what was judged, in the form FA4_AOT_RECORD writes


def test_report_lines_and_summary() -> None:
    ok = coverage.judge("ok-call", [CALL], [([A], "")], {A[1]}.__contains__, fix="F")
    bad = coverage.judge("bad-call", [CALL], [([A, B], "")], {A[1]}.__contains__, fix="fa4-aot build X")
    text = coverage.lines([ok, bad])
    assert text[0].startswith("served   ok-call") and text[1].startswith("MISSING  bad-call  (1 of 2")
    assert "_flash_attn_bwd bbbbbbbbbbbbbbbb…" in text[2] and text[3] == "    add with: fa4-aot build X"
    assert text[-1] == "1 of 2 served, 1 missing"
    assert coverage.summary([ok, bad])["ok"] is False and coverage.summary([ok])["ok"] is True
