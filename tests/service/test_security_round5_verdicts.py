"""Security round 5, the server's side of verdicts, against a real uvicorn on SQLite and on PostgreSQL: a verdict's
`when` is the publisher's word, so the server orders verdicts by its own clock and refuses impossible dates; a
verdict post needs a token allowed every SKU sharing its kernel's facts, as certify claims do; concurrent posts
are written in one transaction each, so the API and the store's verdict files agree and no update is lost."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from fa4_aot.domain.verdicts import Verdict
from fa4_aot.store import Store
from tests.helpers.servers import H200, Server, row_counts
from tests.service.test_verdicts_api import DEV, held_kernel, listed, post, token, verdict


def _utc(offset: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset))


def test_a_future_dated_verdict_does_not_outrank_a_later_measurement(server: Server) -> None:
    key = held_kernel(server)
    pinned = post(server, [verdict(key, "pass", when=_utc(240))])  # within the clock skew the server allows
    assert pinned.status_code == 201, pinned.text
    later = post(server, [verdict(key, "wrong", when=_utc(0))])  # measured after the pass was received
    assert (later.status_code, later.json()) == (201, {"stored": 1, "kept": 0})
    [row] = listed(server, kernel_key=key)
    assert row["status"] == "wrong"
    assert [v.status for v in Store(server.cache_dir).verdicts(key)] == ["wrong"]
    stale = post(server, [verdict(key, "pass", when=_utc(-3600))])  # measured before the held one: still kept out
    assert (stale.status_code, stale.json()) == (200, {"stored": 0, "kept": 1})


IMPOSSIBLE_WHENS = {
    "year-9999": ("9999-12-31T23:59:59Z", "future"),
    "a-day-ahead": (_utc(86400), "future"),
    "before-2020": ("2019-12-31T23:59:59Z", "2020"),
    "no-such-day": ("2026-02-30T10:00:00Z", "not a date"),
    "a-number": (1764756000, "string"),
    "null": (None, "string"),
}


@pytest.mark.bad_input("verdict dates")
@pytest.mark.parametrize(("when", "why"), IMPOSSIBLE_WHENS.values(), ids=IMPOSSIBLE_WHENS.keys())
def test_impossible_verdict_dates_are_refused_with_the_reason(server: Server, when: Any, why: str) -> None:
    key = held_kernel(server)
    before = row_counts(server.db_url)
    answer = post(server, [{**verdict(key), "when": when}])
    assert answer.status_code == 422, answer.text
    assert why in answer.text, answer.text
    assert row_counts(server.db_url) == before and Store(server.cache_dir).verdicts(key) == []


def test_a_verdict_post_needs_a_token_allowed_every_sku_sharing_the_kernels_facts(server: Server) -> None:
    facts = {**H200, "sm_count": 77}  # facts no other test's SKU has
    mine = held_kernel(server, {**facts, "sku": "r5-h200"})
    held_kernel(server, {**facts, "sku": "r5-twin"})  # an admin's twin: the same facts, so the same kernel keys
    only_mine = token(server, "r5-h200-only", ["r5-h200"])
    answer = post(server, [verdict(mine, "pass")], only_mine)
    assert answer.status_code == 403, answer.text
    assert "r5-twin" in answer.json()["detail"] and "same facts" in answer.json()["detail"]
    assert listed(server, kernel_key=mine) == [] and Store(server.cache_dir).verdicts(mine) == []
    both = token(server, "r5-both", ["r5-h200", "r5-twin"])
    assert post(server, [verdict(mine, "pass")], both).status_code == 201


def test_concurrent_verdict_posts_lose_no_update_and_the_api_agrees_with_the_store(server: Server) -> None:
    key, n = held_kernel(server), 20
    bodies = [[verdict(key, "pass" if i % 2 else "wrong", checks=i, when=_utc(i - 60))] for i in range(n)]
    os.sched_yield()
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda body: post(server, body), bodies))
    assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers]
    [row] = listed(server, kernel_key=key)
    [kept] = Store(server.cache_dir).verdicts(key)
    assert (row["checks"], row["status"]) == (n - 1, "pass"), row  # the newest measurement, whatever the order
    assert Verdict.from_dict({k: row[k] for k in kept.to_dict()}) == kept  # one source of truth
    assert httpx.get(f"{server.url}/v1/verdicts", params={"kernel_key": key, "device": DEV}).json() == [row]
