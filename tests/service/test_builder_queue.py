"""The build queue in the server's database (issue 21, point 1), over SQLite and PostgreSQL with a real uvicorn:
concurrent reports of one miss make one job; claims take each job once; a lease that runs out lets another
builder take the job over (its builder died), and the dead builder's late result is refused; the jobs survive a
restart of the server. No compile here: builders are played through the HTTP API (test_builder.py runs real
ones); a lease running out is played by moving it back in the real database (leases last at least 10 s)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import update

from fa4_aot.domain.misses import Miss
from service import db, models
from tests.helpers.builders import hold_sku, tiny
from tests.helpers.servers import Server


def miss(batch: int) -> dict[str, Any]:
    return Miss.lean(tiny(batch=batch), "h200").to_dict()


def claim(c: httpx.Client, builder: str, lease: float = 60.0) -> httpx.Response:
    return c.post("/v1/build-claims", json={"builder": builder, "lease_seconds": lease})


def lapse(server: Server, *job_ids: int) -> None:
    """The leases of `job_ids` ran out an hour ago: their builders are as good as dead."""
    with db.session_for(server.db_url) as session:
        session.execute(update(models.BuildJob).where(models.BuildJob.id.in_(job_ids))
                        .values(lease_until=datetime.now(UTC) - timedelta(hours=1)))
        session.commit()


def test_concurrent_reports_of_one_miss_make_one_job(server: Server) -> None:
    hold_sku(server)
    doc = miss(1001)

    def report(_i: int) -> int:
        with server.client() as c:
            return int(c.post("/v1/misses", json=doc).json()["build"]["id"])

    with ThreadPoolExecutor(32) as pool:
        ids = list(pool.map(report, range(64)))
    assert len(set(ids)) == 1
    with server.client() as c:
        job = c.get(f"/v1/builds/{ids[0]}").json()
    assert job["reports"] == 64 and job["status"] == "queued" and job["kernel_key"] == doc["kernel_key"]


def test_claims_take_each_job_once_and_a_lapsed_lease_is_taken_over(server: Server) -> None:
    hold_sku(server)
    with server.client("publish") as c:
        while claim(c, "drain").status_code == 200:  # jobs other tests left queued
            pass
        ids = [c.post("/v1/misses", json=miss(2000 + i)).json()["build"]["id"] for i in range(3)]

        def take(name: str) -> dict[str, Any] | None:
            answer = claim(c, name, lease=10.0)
            return dict(answer.json()) if answer.status_code == 200 else None

        with ThreadPoolExecutor(8) as pool:
            taken = [t for t in pool.map(take, [f"b{i}" for i in range(8)]) if t is not None]
        assert sorted(t["id"] for t in taken) == sorted(ids)  # each job once, to one builder
        assert claim(c, "late").status_code == 204
        lapse(server, *ids)  # every lease lapses: their builders are as good as dead
        again = claim(c, "heir").json()
        assert again["id"] in ids and again["attempts"] == 2 and again["args"] is None and again["compile_key"]
        dead = next(j for j in c.get("/v1/builds?status=running").json() if j["id"] == again["id"])
        assert dead["builder"] == "heir"
        # the dead builders' results come too late, whatever name and claim they send: refused, the heir's stands
        old = {"status": "rejected", "detail": "FA4 refused it", "compile_seconds": 1.0, "built": 1}
        refused = [c.post(f"/v1/builds/{again['id']}/finish",
                          json={**old, "builder": t["builder"], "claim": t["claim"]}).status_code for t in taken]
        refused += [c.post(f"/v1/builds/{again['id']}/finish",
                           json={**old, "builder": "heir", "claim": t["claim"]}).status_code for t in taken]
        assert set(refused) == {409}
        renewed = c.post(f"/v1/builds/{again['id']}/lease",
                         json={"builder": "heir", "claim": again["claim"], "lease_seconds": 60})
        assert renewed.status_code == 200
        ended = c.post(f"/v1/builds/{again['id']}/finish", json={**old, "builder": "heir", "claim": again["claim"]})
        assert ended.json()["status"] == "rejected" and ended.json()["finished"] and ended.json()["built"] == 1
    with server.client("read") as c:  # builders need a publish token
        assert claim(c, "reader").status_code == 403
    text = httpx.get(f"{server.url}/metrics").text
    assert "fa4_aot_build_compile_seconds_count" in text and 'fa4_aot_build_jobs{status="running"}' in text


def test_jobs_survive_a_server_restart(launch: Any) -> None:
    server: Server = launch()
    hold_sku(server)
    with server.client("publish") as c:
        queued = c.post("/v1/misses", json=miss(3000)).json()["build"]
        second = c.post("/v1/misses", json=miss(3001)).json()["build"]
        assert claim(c, "x").json()["id"] == queued["id"]
    server.kill()
    server.start()
    with server.client("publish") as c:
        assert c.get(f"/v1/builds/{queued['id']}").json()["status"] == "running"
        assert claim(c, "y").json()["id"] == second["id"]
        assert c.post("/v1/misses", json=miss(3000)).json()["build"]["reports"] == 2


def test_a_wait_that_times_out_raises_kernel_missing_naming_the_job(server: Server, tmp_path: Any,
                                                                     monkeypatch: Any) -> None:
    import pytest

    from fa4_aot.errors import KernelMissing
    from tests.helpers.builders import lean_client, served

    hold_sku(server)
    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", "1.5")  # no builder runs: the job stays queued
    started = time.monotonic()
    with pytest.raises(KernelMissing, match=r"build job \d+ was still queued after FA4_AOT_BUILD_WAIT=1.5 s"):
        served(lean_client(server, tmp_path / "client"), tiny(batch=4000))
    assert time.monotonic() - started < 30
    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", "soon")
    with pytest.raises(Exception, match="invalid FA4_AOT_BUILD_WAIT='soon'"):
        served(lean_client(server, tmp_path / "client"), tiny(batch=4000))


def test_a_job_whose_builders_keep_dying_fails_and_an_admin_can_retry_it(server: Server) -> None:
    hold_sku(server)
    doc = miss(5000)
    with server.client("publish") as c:
        while claim(c, "drain").status_code == 200:  # jobs other tests left queued
            pass
        job = c.post("/v1/misses", json=doc).json()["build"]
        for attempt in (1, 2, 3):  # each builder dies: its lease lapses
            assert claim(c, f"dies{attempt}", lease=10.0).json()["attempts"] == attempt
            lapse(server, job["id"])
        assert claim(c, "next").status_code == 204
        failed = c.get(f"/v1/builds/{job['id']}").json()
        assert failed["status"] == "failed" and "stopped answering 3 times" in failed["detail"]
        assert c.post("/v1/misses", json=doc).json()["build"]["status"] == "failed"  # reports: answered, not rerun
    with server.client("admin") as c:
        assert c.delete(f"/v1/misses/{doc['kernel_key']}").status_code == 204
        again = c.post("/v1/misses", json=doc).json()["build"]
    assert again["status"] == "queued" and again["id"] != job["id"]
