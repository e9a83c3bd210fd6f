"""Issue 28, security round 4: miss admission (D31, D32, D36), over SQLite and PostgreSQL with a real uvicorn.
A reported miss decides what a builder compiles, so the server checks a lean miss's key against its call (D31),
refuses calls outside FA4's own ranges, spends a per-SKU hourly budget of anonymous builds and hands builders a
token's job before anonymous ones, round robin across reporters (D32), and a DELETE of a miss takes its queued
or ended jobs with it (D36). No compile here: builders are played through the HTTP API; a job's failure is
written into the real database, as a builder's end would leave it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import update

from fa4_aot.domain.misses import Miss, lean_key
from service import db, models
from tests.conftest import run_cli
from tests.helpers.builders import hold_sku, tiny
from tests.helpers.servers import Server, kernel_doc

Launch = Any


def miss(batch: int, **changes: Any) -> dict[str, Any]:
    return Miss.lean(tiny(batch=batch, **changes), "h200").to_dict()


def claim(c: httpx.Client, builder: str = "b") -> httpx.Response:
    return c.post("/v1/build-claims", json={"builder": builder, "lease_seconds": 60})


def drain(server: Server) -> None:
    """Claim every job other tests of the shared server left queued."""
    with server.client("publish") as c:
        while claim(c, "drain").status_code == 200:
            pass


def fail_job(server: Server, job_id: int, detail: str = "compiler died") -> None:
    with db.session_for(server.db_url) as session:
        session.execute(update(models.BuildJob).where(models.BuildJob.id == job_id)
                        .values(status="failed", detail=detail, lease_until=None))
        session.commit()


def test_d31_a_lean_key_must_be_its_calls_key(server: Server) -> None:
    hold_sku(server)
    a, b = miss(3101), miss(3102, softcap=0.5)
    forged = {**a, "call": b["call"], "compile_key": b["compile_key"]}
    with server.client() as c:
        answer = c.post("/v1/misses", json=forged)
        assert answer.status_code == 422, answer.text
        assert "kernel_key" in answer.text and a["kernel_key"] in answer.text
        # the call's own key, but a compile key of another call: refused too
        mixed = {**b, "compile_key": a["compile_key"]}
        assert c.post("/v1/misses", json=mixed).status_code == 422
        no_call = {**a, "call": None}
        assert c.post("/v1/misses", json=no_call).status_code == 422
        honest = c.post("/v1/misses", json=a)
        assert honest.status_code == 202, honest.text
        job = honest.json()["build"]
        assert job["call"] == {**a["call"], "window": list(a["call"]["window"])}
        assert job["kernel_key"] == a["kernel_key"]


def test_d31_client_and_service_share_one_key_function() -> None:
    call = tiny(batch=3103)
    assert Miss.lean(call, "h200").kernel_key == lean_key(call.to_dict(), "h200")


@pytest.mark.parametrize("changes", [
    {"softcap": -2.5}, {"head_dim": 7, "head_dim_v": 7}, {"head_dim": 1000, "head_dim_v": 1000},
    {"head_dim": 64, "head_dim_v": 300}, {"heads_q": 3, "heads_kv": 2}, {"mask": "local", "window": [-5, 3]},
    {"page_size": 16}, {"layout": "paged", "page_size": 0},
])
def test_d32_a_call_outside_fa4s_ranges_is_refused(server: Server, changes: dict[str, Any]) -> None:
    hold_sku(server)
    with server.client() as c:
        answer = c.post("/v1/misses", json=miss(3201, **changes))
    assert answer.status_code == 422, answer.text
    assert "FA4" in answer.text


def test_d32_fa4s_edge_shapes_are_accepted(server: Server) -> None:
    hold_sku(server)
    with server.client("read") as c:
        for batch, changes in enumerate([{"head_dim": 192, "head_dim_v": 128}, {"head_dim": 64, "head_dim_v": 512},
                                         {"mask": "local", "window": [-1, 0]}, {"softcap": 30.0}]):
            answer = c.post("/v1/misses", json=miss(3210 + batch, **changes))
            assert answer.status_code == 202, (changes, answer.text)


def test_d32_a_lean_miss_carries_nothing_large(server: Server) -> None:
    hold_sku(server)
    doc = miss(3220)
    with server.client() as c:
        padded = c.post("/v1/misses", json={**doc, "args": {"padding": "x" * 12000}})
        assert padded.status_code == 422, padded.text
        big_key = {**doc, "family": "FlashAttentionForwardSm90", "compile_key": ["x" * 6000]}
        assert c.post("/v1/misses", json=big_key).status_code == 422


def test_d32_anonymous_builds_have_an_hourly_budget_per_sku(launch: Launch) -> None:
    server = launch(anonymous_builds_per_hour="2")
    hold_sku(server)
    with server.client() as c:
        for batch in (3230, 3231):
            assert c.post("/v1/misses", json=miss(batch)).json()["build"]["status"] == "queued"
        spent = c.post("/v1/misses", json=miss(3232))
        assert spent.status_code == 429, spent.text
        assert 0 < int(spent.headers["Retry-After"]) <= 3600
        assert "FA4_AOT_ANONYMOUS_BUILDS_PER_HOUR" in spent.text
        again = c.post("/v1/misses", json=miss(3230))  # a known job is answered, not built again
        assert again.status_code == 202
    with server.client("read") as c:  # a token's report is not anonymous
        assert c.post("/v1/misses", json=miss(3233)).status_code == 202


def test_d32_a_tokens_job_comes_before_anonymous_ones_round_robin(launch: Launch) -> None:
    server = launch()
    hold_sku(server)
    with server.client() as anon:
        anonymous = [anon.post("/v1/misses", json=miss(3240 + i)).json()["build"]["id"] for i in range(3)]
    with server.client("read") as reader:
        read_jobs = [reader.post("/v1/misses", json=miss(3250 + i)).json()["build"]["id"] for i in range(3)]
    with server.client("publish") as publisher:
        publish_job = publisher.post("/v1/misses", json=miss(3260)).json()["build"]["id"]
        order = [claim(publisher).json()["id"] for _ in range(7)]
    assert order[:4] == [read_jobs[0], publish_job, read_jobs[1], read_jobs[2]], (order, read_jobs, publish_job)
    assert order[4:] == anonymous


def test_d36_deleting_a_miss_cancels_its_queued_job(server: Server) -> None:
    hold_sku(server)
    doc = miss(3601)
    with server.client() as c:
        job = c.post("/v1/misses", json=doc).json()["build"]
    with server.client("admin") as c:
        assert c.delete(f"/v1/misses/{doc['kernel_key']}").status_code == 204
        assert c.get(f"/v1/builds/{job['id']}").status_code == 404
        gone = c.delete(f"/v1/misses/{doc['kernel_key']}")
        assert gone.status_code == 404 and "nothing" in gone.text
    with server.client() as c:  # the next report queues it again
        again = c.post("/v1/misses", json=doc).json()["build"]
        assert again["status"] == "queued" and again["id"] != job["id"]


def test_d36_a_running_job_is_named_and_removed_once_it_ends(server: Server) -> None:
    hold_sku(server)
    drain(server)
    doc = miss(3602)
    with server.client() as c:
        job = c.post("/v1/misses", json=doc).json()["build"]
    with server.client("publish") as c:
        assert claim(c, "b36").json()["id"] == job["id"]
    with server.client("admin") as c:
        assert c.delete(f"/v1/misses/{doc['kernel_key']}").status_code == 204  # the miss itself
        running = c.delete(f"/v1/misses/{doc['kernel_key']}")
        assert running.status_code == 409 and "b36" in running.text, running.text
        fail_job(server, job["id"])
        assert c.delete(f"/v1/misses/{doc['kernel_key']}").status_code == 204
        assert c.get(f"/v1/builds/{job['id']}").status_code == 404
        assert c.delete(f"/v1/misses/{doc['kernel_key']}").status_code == 404


def test_d45_an_unknown_host_target_is_refused(server: Server) -> None:
    data = b"d45 host target"
    doc = kernel_doc(data, host="pdp-11")
    with server.client("publish") as c:
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
        answer = c.post("/v1/kernels", json=doc)
    assert answer.status_code == 422, answer.text
    assert "pdp-11" in answer.text and "x86-64-v3" in answer.text and "neoverse-v2" in answer.text


def test_d44_the_cli_prints_no_terminal_escapes_from_server_text(server: Server) -> None:
    hold_sku(server)
    with server.client() as c:
        job = c.post("/v1/misses", json=miss(4401)).json()["build"]
    fail_job(server, job["id"], detail="boom\x1b]0;owned\x07\x1b[2J\rhidden\u202eevil")
    for args in (["--id", str(job["id"])], ["--status", "failed"]):
        shown = run_cli("builds", "--server", server.url, *args)
        assert shown.returncode == 0, shown.stderr
        assert "boom" in shown.stdout and "hidden" in shown.stdout
        assert not {"\x1b", "\x07", "\r", "\u202e"} & set(shown.stdout), repr(shown.stdout)
        assert "\\x1b" in shown.stdout  # shown escaped, so an operator still sees it was there
