"""Certify-job answers are checked before use (remote/certify_jobs.py): a well-formed job parses into its typed
value; anything else, whatever its shape, is one RemoteError naming the server, never a KeyError or TypeError that
would kill a certifier or a waiting client (issue 28, D42, for certify jobs)."""

from __future__ import annotations

from typing import Any

import pytest

from fa4_aot.domain.verdicts import Verdict
from fa4_aot.errors import RemoteError
from fa4_aot.remote.certify_jobs import job_of, jobs_of

KEY = "ab" * 32
DEVICE = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
GOOD: dict[str, Any] = {
    "id": 7, "sku": "h200", "kernel_key": KEY, "keys": [KEY], "family": "FlashAttentionForwardSm90", "status": "done",
    "attempts": 1, "lapses": 0, "certifier": "gpu-1", "device": DEVICE, "created": "2026-12-03T00:00:00Z",
    "started": None, "finished": None, "lease_until": None, "detail": "", "verdict": "pass",
    "verdicts": [Verdict(KEY, DEVICE, "pass", checks=3).to_dict()], "seconds": 2.0, "claim": None,
}


def test_a_job_parses_into_its_value() -> None:
    job = job_of(GOOD, "http://s/v1/certify-jobs/7")
    assert (job.id, job.keys, job.ended, job.claim) == (7, (KEY,), True, "")
    assert job.verdicts[0].passed and "verdict pass" in job.describe()
    assert jobs_of([GOOD, {**GOOD, "status": "queued", "claim": "c" * 32}], "s")[1].claim == "c" * 32


@pytest.mark.parametrize("bad", [
    None, [], "job", {"id": 7}, {**GOOD, "id": "abc"}, {**GOOD, "id": True}, {**GOOD, "id": -1}, {**GOOD, "id": 1e300},
    {**GOOD, "kernel_key": "../../etc"}, {**GOOD, "keys": KEY}, {**GOOD, "keys": [1]}, {**GOOD, "status": "won"},
    {**GOOD, "verdicts": [{"kernel_key": KEY}]}, {**GOOD, "verdicts": [{**GOOD["verdicts"][0], "status": "fine"}]},
    {**GOOD, "verdicts": None}, {**GOOD, "detail": ["x"]}, {**GOOD, "claim": 5},
], ids=lambda b: str(b)[:40])
def test_anything_else_is_a_remote_error(bad: Any) -> None:
    with pytest.raises(RemoteError, match="http://s.*not a certify job|not a list of certify jobs"):
        job_of(bad, "http://s/v1/certify-jobs/7")


def test_a_listing_that_is_not_a_list_is_a_remote_error() -> None:
    with pytest.raises(RemoteError, match="not a list of certify jobs"):
        jobs_of({"jobs": []}, "http://s/v1/certify-jobs")
