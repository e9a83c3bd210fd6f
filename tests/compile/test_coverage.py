"""coverage.judge as a table: what the store holds against what FA4's dispatch picks per call."""

from __future__ import annotations

import pytest

from fa4_aot.compile import coverage
from fa4_aot.compile.coverage_lean import Lookup
from tests.domain.test_record import CALL

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


@pytest.mark.parametrize("lookups,stored,served,missing,unrecorded,errors", [
    ([Lookup((A, B))], {A[1], B[1]}, True, [], 0, 0),
    ([Lookup((A, B))], {A[1]}, False, [B], 0, 0),  # a region whose kernel is not stored (or unlinked)
    ([Lookup((), outside="batch=32, seqlen_q=1")], {A[1]}, False, [], 1, 0),  # no region holds
    ([Lookup((A,)), Lookup((A, C))], {A[1]}, False, [C], 0, 0),  # kernels of every call, once
    ([Lookup((), unsupported="num_splits=3 on sm_90")], set(), False, [], 0, 1),  # never served
])
def test_judge_lean(lookups, stored, served, missing, unrecorded, errors) -> None:
    calls = [CALL] * len(lookups)
    v = coverage.judge_lean("x", calls, lookups, stored.__contains__, fix="fa4-aot build --sku h200 --calls f")
    assert (v.served, v.missing, len(v.unrecorded), len(v.errors)) == (served, missing, unrecorded, errors)
    doc = v.to_dict()
    assert doc["served"] == served and len(doc["unrecorded"]) == unrecorded
    assert doc["fix"] == ("" if served else "fa4-aot build --sku h200 --calls f")


def test_lean_lines_name_the_sizes_no_region_holds_and_the_fix() -> None:
    bad = coverage.judge_lean("decode", [CALL], [Lookup((), outside="batch=32, seqlen_q=1")], set().__contains__,
                              fix="fa4-aot build X")
    text = coverage.lines([bad])
    assert text[0] == "MISSING  decode  (0 of 0 kernel(s) not in the store, 1 without a recipe region)"
    assert "no recipe region holds at batch=32, seqlen_q=1" in text[1] and text[2] == "    add with: fa4-aot build X"


def test_refused_calls_and_the_certification_of_stored_kernels() -> None:
    """A call the known-bad registry refuses is neither served nor missing (no build serves it); the kernels a
    verdict needs that the store holds are counted certified, failed or unchecked."""
    standings = {A[1]: "certified", B[1]: "failed"}
    ok = coverage.judge("ok", [CALL], [coverage.Planned([A, B, C])], {A[1], B[1]}.__contains__, fix="F",
                        standing_of=standings.__getitem__)
    bad = coverage.judge("hd72", [CALL], [coverage.Planned([], refused="known bad (x): wrong dq (source: #1)")],
                         set().__contains__, fix="F", standing_of=standings.__getitem__)
    assert (ok.served, ok.certification(), ok.failed_kernels()) == (False, {"certified": 1, "failed": 1,
                                                                           "unchecked": 0}, [B])
    assert (bad.served, bad.missing, bad.refused) == (False, [], [f"{CALL.describe()}: known bad (x): wrong dq "
                                                                  "(source: #1)"])
    s = coverage.summary([ok, bad])
    assert (s["served"], s["missing"], s["refused"], s["ok"]) == (0, 1, 1, False)
    assert s["certification"] == {"certified": 1, "failed": 1, "unchecked": 0}
    text = coverage.lines([ok, bad])
    assert text[0].endswith("(1 of 3 kernel(s) not in the store; 1 certified, 1 failed, 0 unchecked)")
    assert text[2].startswith("    failed certification: _flash_attn_bwd bbbbbbbbbbbbbbbb…")
    assert text[4].startswith("REFUSED  hd72")
    assert text[5] == f"    {CALL.describe()}: known bad (x): wrong dq (source: #1)"
    assert text[-1] == "0 of 2 served, 1 missing, 1 refused (known bad); stored kernels: 1 certified, 1 failed, " \
                       "0 unchecked"
