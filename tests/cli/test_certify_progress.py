"""`fa4-aot certify`'s progress says what each failing check found as it comes (tensor, error, bound; the crash's
error; the kernels), in JSON lines and plain lines: the default h200 build's certification on the H200
(2026-12-03) ran out of its lease before its end, and its 25 wrong checks and one crash were known only as
"status": "wrong" with no tensor, no error and no kernel (verdicts are kept only when a run ends)."""

from __future__ import annotations

import json

import pytest

from fa4_aot.certify.plan import Check, Use
from fa4_aot.certify.pool import Outcome
from fa4_aot.cli.certify_cmds import _progress
from fa4_aot.cli.progress import Progress
from fa4_aot.domain.signature import Signature

SIG = Signature("varlen", "bwd", "bf16", 80, 80, "causal", (0, 0), 0.0, False, 1, 8, 8, 0)
CHECK = Check(SIG, {"batch": 3, "max_seqlen_q": 2, "max_seqlen_k": 258, "total_q": 6, "total_k": 65,
                    "heads_kv": 8}, (Use("FlashAttentionBackwardSm90", "ab" * 32),), "small", 27)


def _events(capsys: pytest.CaptureFixture[str], outcome: Outcome, *, as_json: bool) -> str:
    with Progress("certify", quiet=False, as_json=as_json, tty=False) as bar:
        _progress(bar)(1, 2, outcome)
    return capsys.readouterr().err


def test_h200_default_build_partial_certify_says_what_failed(capsys: pytest.CaptureFixture[str]) -> None:
    wrong = Outcome("c1", CHECK, "wrong", "bwd", [{"tensor": "dq", "error": 1.92, "bound": 0.038}], "", 0.1)
    event = json.loads(_events(capsys, wrong, as_json=True))
    assert event["status"] == "wrong" and event["part"] == "bwd"
    assert event["failures"] == [{"tensor": "dq", "error": 1.92, "bound": 0.038}]
    assert event["kernels"] == ["ab" * 32]
    assert "dq 1.92 > 0.038" in _events(capsys, wrong, as_json=False)

    crash = Outcome("c2", CHECK, "crash", "fwd", [], "CUDA error: an illegal memory access was encountered", 0.3)
    event = json.loads(_events(capsys, crash, as_json=True))
    assert event["detail"].startswith("CUDA error: an illegal memory access")
    assert "illegal memory access" in _events(capsys, crash, as_json=False)


def test_a_passing_check_stays_one_short_event(capsys: pytest.CaptureFixture[str]) -> None:
    event = json.loads(_events(capsys, Outcome("c3", CHECK, "pass", seconds=0.05), as_json=True))
    assert event["status"] == "ok" and "failures" not in event and "kernels" not in event


def test_h200_default_certify_summary_counts_out_of_memory_errors() -> None:
    # 1,693 checks ended in an error there, all but 20 of them unseen in the summary
    from fa4_aot.certify.driver import Report
    from fa4_aot.cli.certify_cmds import _summary

    report = Report("h200", "nvidia-h200", checks=3, errors=["a: out of GPU memory, not a kernel fault: ..."] * 25
                    + ["b: KernelMissing"], out_of_memory=25)
    text = _summary(report)
    assert "26 check(s) ended in an error" in text and "25 ran out of GPU memory" in text
    assert Report("h200", "x", out_of_memory=2).to_dict()["out_of_memory"] == 2


def test_a_certify_report_says_where_its_time_went() -> None:
    # the default build's certification has a time goal: its report names each step's share (plan, checks, FA4's
    # JIT as the oracle, keeping the verdicts), so a slow run says which step to look at
    from fa4_aot.certify.driver import Report, _laps
    from fa4_aot.cli.certify_cmds import _summary

    report = Report("h100-sxm", "nvidia-h100", checks=2, seconds=9.0)
    lap = _laps(report.phases, 0.0)
    lap("plan")
    lap("checks")
    assert list(report.phases) == ["plan", "checks"] and report.phases["plan"] > 0 <= report.phases["checks"]
    report.phases = {"plan": 1.04, "checks": 6.0, "oracle": 1.5, "keep": 0.5}
    assert report.to_dict()["phases"] == {"plan": 1.0, "checks": 6.0, "oracle": 1.5, "keep": 0.5}
    assert "9s: plan 1s, checks 6s, oracle 2s, keep 0s)" in _summary(report)
