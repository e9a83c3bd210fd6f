"""How a build job ends, from its build reports (fa4_aot.compile.builder.outcome_of, pure): a table."""

from __future__ import annotations

import pytest

from fa4_aot.compile.builder import outcome_of
from fa4_aot.compile.orchestrator import Report, Result


def report(*results: Result, rejected: str = "", refused: str = "", recipes: int = 0) -> Report:
    r = Report(sku="h200", results=list(results), recipes=recipes)
    if rejected:
        r.call_failures.append(Result("failed", "", "", "from-misses", "fwd", error=rejected))
    if refused:  # the known-bad registry (compile/refusals.py)
        r.refused.append(Result("refused", "", "", "from-misses", "bwd", error=refused))
    return r


BUILT = Result("built", "FlashAttentionForwardSm90", "a" * 64, "from-misses", "fwd", seconds=4.5)
PRESENT = Result("present", "FlashAttentionForwardSm90", "b" * 64, "from-misses", "fwd")
FAILED = Result("failed", "FlashAttentionForwardSm90", "c" * 64, "from-misses", "fwd", error="ptxas died")


@pytest.mark.parametrize(("reports", "status", "detail", "built", "seconds"), [
    ([report(BUILT, PRESENT, recipes=16)], "done", "1 kernel(s) built, 1 present, 16 recipe region(s)", 1, 4.5),
    ([report(PRESENT)], "done", "0 kernel(s) built, 1 present", 0, 0.0),
    ([report(BUILT, FAILED)], "failed", "ptxas died", 1, 4.5),
    ([report(FAILED, rejected="head_dim must be <= 256")], "rejected", "head_dim must be <= 256", 0, 0.0),
    ([report(refused="known bad (sm90-bwd-dq-hd72-80): wrong dq (source: #2896)")], "rejected",
     "known bad (sm90-bwd-dq-hd72-80): wrong dq (source: #2896)", 0, 0.0),
    ([], "failed", "this builder's variants file has no SKU 'h200'", 0, 0.0),
])
def test_outcome_of(reports: list[Report], status: str, detail: str, built: int, seconds: float) -> None:
    outcome = outcome_of(reports, "h200")
    assert (outcome.status, outcome.built, outcome.compile_seconds) == (status, built, seconds)
    assert detail in outcome.detail


@pytest.mark.parametrize(("value", "seconds"), [("", 0.0), ("0", 0.0), ("120", 120.0), (" 2.5 ", 2.5)])
def test_build_wait_seconds(monkeypatch: pytest.MonkeyPatch, value: str, seconds: float) -> None:
    from fa4_aot.remote import wait

    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", value)
    assert wait.seconds() == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_build_wait_refuses_what_is_not_seconds(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from fa4_aot.errors import ConfigError
    from fa4_aot.remote import wait

    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", value)
    with pytest.raises(ConfigError, match="FA4_AOT_BUILD_WAIT"):
        wait.seconds()


@pytest.mark.parametrize(("job", "says"), [
    ({"id": 4, "status": "done", "detail": ""}, ""),
    ({"id": 4, "status": "rejected", "detail": "head_dim must be <= 256"},
     "FA4 rejects this call (build job 4): head_dim must be <= 256"),
    ({"id": 4, "status": "failed", "detail": "ptxas died"}, "build job 4 failed: ptxas died"),
    ({"id": 4, "status": "running", "detail": ""}, "build job 4 was still running after FA4_AOT_BUILD_WAIT=30 s"),
])
def test_build_wait_says_why_a_job_did_not_help(job: dict, says: str) -> None:
    from fa4_aot.domain.misses import BuildJob
    from fa4_aot.remote import wait

    problem = wait._problem(BuildJob.from_dict({**job, "sku": "h200", "kernel_key": "a" * 64, "family": "f"}), 30.0)
    assert problem.startswith(says) and bool(problem) == bool(says)
