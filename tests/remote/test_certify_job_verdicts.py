"""A verdict inside a certify-job answer is checked as one from GET /v1/verdicts is (answers.checked_verdict, the
check a signed listing passes): a `when` that is not a UTC time, a count that is not a count... is the server's
failure, never a verdict kept in the store, where it made `wait.certified` raise TypeError and `fa4-aot list` and
`sign` exit with a traceback."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.errors import RemoteError
from fa4_aot.remote import wait
from fa4_aot.remote.answers import verdict_of
from fa4_aot.remote.certify_jobs import job_of
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from tests.helpers.raw_server import RawServer, reply
from tests.remote.test_certify_jobs import DEVICE, GOOD, KEY

pytestmark = pytest.mark.bad_input("server answers")
VERDICT: dict[str, Any] = GOOD["verdicts"][0]
BAD_VERDICTS = {
    "when-a-number": {**VERDICT, "when": 5},
    "when-a-list": {**VERDICT, "when": ["2026"]},
    "when-not-a-time": {**VERDICT, "when": "yesterday"},
    "checks-a-string": {**VERDICT, "checks": "3"},
    "checks-negative": {**VERDICT, "checks": -1},
    "error-a-bool": {**VERDICT, "status": "wrong", "tensor": "dq", "error": True, "bound": 0.1},
    "toolchain-a-number": {**VERDICT, "toolchain": 4},
}


@pytest.mark.parametrize("bad", BAD_VERDICTS.values(), ids=BAD_VERDICTS.keys())
def test_a_malformed_verdict_in_a_certify_job_is_refused_as_in_a_verdict_listing(bad: dict[str, Any]) -> None:
    with pytest.raises(RemoteError, match="not a verdict"):
        verdict_of(bad, "http://s/v1/verdicts")
    with pytest.raises(RemoteError, match="http://s.*not a certify job"):
        job_of({**GOOD, "verdicts": [bad]}, "http://s/v1/certify-jobs/7")


def _serving_a_job_with(verdict: dict[str, Any]) -> RawServer:
    holder: list[RawServer] = []
    body = reply(200, json.dumps([{**GOOD, "verdicts": [verdict]}]).encode())

    def answer(path: str, conn: socket.socket) -> None:
        holder[0].send(conn, body if path.startswith("/v1/certify-jobs") else reply(200, b"[]"))

    server = RawServer(answer)
    holder.append(server)
    return server


@pytest.mark.parametrize("when", [5, None, ["x"]], ids=["a-number", "null", "a-list"])
def test_a_certify_wait_names_a_verdict_whose_when_is_not_a_time(tmp_path: Path, when: Any) -> None:
    with _serving_a_job_with({**VERDICT, "when": when}) as server:
        remote = Remote(server.url, retries=0)
        problem = wait.certified(remote, Store(tmp_path), [KEY], DEVICE, time.monotonic() + 5)
        remote.close()
    assert "could not be followed" in problem and "not a certify job" in problem, problem
    assert Store(tmp_path).verdicts(KEY) == []  # nothing malformed is kept for the gate, `list` or `sign`
