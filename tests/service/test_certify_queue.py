"""The certify-job queue (issue 27, point 5) over SQLite and PostgreSQL with a real uvicorn: publishing a kernel
queues one job; only a publish token allowed the job's SKU claims it, and only the claiming token with its claim id
renews or finishes it (issue 28's D30, not copied from the build queue); a lapsed lease returns the job and the
late result is refused; a certifier process killed mid-job (a real subprocess running the real certifier loop,
SIGKILLed) loses the job to the next, and after 3 deaths the job ends failed with verdict crash; a finish by the
right token keeps verdicts readable through GET."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.store import Store
from tests.helpers.certifiers import (
    DEVICE,
    OTHER_DEVICE,
    as_token,
    claim,
    facts,
    finish,
    publish,
    renew,
    sku_arg,
    token,
    verdict,
)
from tests.helpers.servers import H200, ROOT, Launch, Server


def job_of(server: Server, key: str) -> dict[str, Any]:
    with server.client() as c:
        jobs = c.get("/v1/certify-jobs", params={"kernel_key": key}).json()
    assert len(jobs) == 1, jobs
    return dict(jobs[0])


def test_publishing_a_kernel_queues_one_job(server: Server) -> None:
    with server.client("publish") as c:
        doc = publish(c, "cq-pub")
        assert c.post("/v1/kernels", json=doc).status_code == 200  # published again: still one job
    job = job_of(server, doc["kernel_key"])
    assert (job["status"], job["sku"], job["keys"], job["attempts"], job["claim"]) == (
        "queued", "cq-pub", [doc["kernel_key"]], 0, None)
    with server.client() as c:
        assert c.get(f"/v1/certify-jobs/{job['id']}").json()["kernel_key"] == doc["kernel_key"]
        assert c.get("/v1/certify-jobs", params={"sku": "cq-pub", "status": "queued"}).json()[0]["id"] == job["id"]
        assert c.get("/v1/certify-jobs/999999").status_code == 404
        text = c.get("/metrics").text
    assert 'fa4_aot_certify_jobs{status="queued"}' in text


def test_only_the_claiming_token_with_its_claim_renews_or_finishes(server: Server) -> None:
    mine, other = token(server, "cq-mine", ["cq-d30"]), token(server, "cq-other", ["cq-elsewhere"])
    with server.client("publish") as c:
        doc = publish(c, "cq-d30")
    key = doc["kernel_key"]
    with as_token(server, other) as c:  # a token of another SKU cannot claim it
        assert claim(c, "cq-d30").status_code == 403
    with as_token(server, mine) as c:
        answer = claim(c, "cq-d30", name="holder")
        assert answer.status_code == 200, answer.text
        job, claim_id = answer.json(), answer.json()["claim"]
        assert job["kernel_key"] == key and job["status"] == "running" and job["attempts"] == 1 and claim_id
    assert job_of(server, key)["claim"] is None  # readers never see the claim id
    with as_token(server, other) as c:  # nor renew or finish it, even with the claim id
        assert renew(c, job, claim_id, "holder").status_code == 403
        assert finish(c, job, claim_id, verdicts=[verdict(key)], name="holder").status_code == 403
    with server.client("publish") as c:  # a token allowed every SKU, but not the one that claimed it
        assert renew(c, job, claim_id, "holder").status_code == 403
        assert finish(c, job, claim_id, verdicts=[verdict(key)], name="holder").status_code == 403
    with as_token(server, mine) as c:  # the claiming token, but not its claim
        assert finish(c, job, None, verdicts=[verdict(key)]).status_code == 422
        assert finish(c, job, "x" * 32, verdicts=[verdict(key)]).status_code == 409
        assert renew(c, job, "x" * 32).status_code == 409
        assert finish(c, job, claim_id, verdicts=[verdict("ab" * 32)]).status_code == 422  # another kernel's
        assert finish(c, job, claim_id, verdicts=[verdict(key, device=OTHER_DEVICE)]).status_code == 422
        assert finish(c, job, claim_id, verdicts=[]).status_code == 422  # done without a verdict
    assert job_of(server, key)["status"] == "running" and not Store(server.cache_dir).verdicts(key)
    with as_token(server, mine) as c:
        assert renew(c, job, claim_id, "holder").status_code == 200
        done = finish(c, job, claim_id, verdicts=[verdict(key, "wrong", tensor="dq", error=1.3, bound=0.02)])
        assert done.status_code == 200, done.text
        assert finish(c, job, claim_id, verdicts=[verdict(key)]).status_code == 409  # it ended
    _check_kept(server, key)


def _check_kept(server: Server, key: str) -> None:
    """The finished job's verdict: on the job, in the verdicts table, in the server's store, in the metrics."""
    job = job_of(server, key)
    assert (job["status"], job["verdict"], job["seconds"]) == ("done", "wrong", 1.5)
    assert [v["tensor"] for v in job["verdicts"]] == ["dq"] and "dq off by 1.3" in job["detail"]
    with server.client() as c:
        listed = c.get("/v1/verdicts", params={"kernel_key": key}).json()
        text = c.get("/metrics").text
    assert [(v["device"], v["status"], v["error"]) for v in listed] == [(DEVICE, "wrong", 1.3)]
    assert [v.status for v in Store(server.cache_dir).verdicts(key)] == ["wrong"]
    assert 'fa4_aot_certify_jobs_ended_total{verdict="wrong"}' in text and "fa4_aot_certify_seconds_count" in text


def test_leases_are_bounded_and_a_lapsed_one_returns_the_job(server: Server) -> None:
    holder = token(server, "cq-lapse", ["cq-lapse"])
    with server.client("publish") as c:
        doc = publish(c, "cq-lapse")
    with as_token(server, holder) as c:
        assert claim(c, "cq-lapse", lease=1.0).status_code == 422  # a 1 s lease would burn attempts
        assert claim(c, "cq-lapse", lease=3601).status_code == 422
        assert claim(c, "cq-lapse", device="a gpu").status_code == 422
        assert claim(c, "cq-nothing-here").status_code == 403  # limited to cq-lapse
        with server.client("publish") as every:
            assert claim(every, "cq-nothing-here").status_code == 404
        first = claim(c, "cq-lapse", name="first").json()
        assert claim(c, "cq-lapse", name="second").status_code == 204  # held: nothing else to claim
        time.sleep(10.5)  # the first certifier is as good as dead
        heir = claim(c, "cq-lapse", name="heir").json()
        assert (heir["id"], heir["attempts"], heir["lapses"], heir["certifier"]) == (first["id"], 2, 1, "heir")
        assert finish(c, first, first["claim"], verdicts=[verdict(doc["kernel_key"])]).status_code == 409  # late
        assert renew(c, heir, heir["claim"], "heir").status_code == 200
        failed = finish(c, heir, heir["claim"], status="failed", name="heir").json()
        assert (failed["status"], failed["attempts"]) == ("queued", 2) and "queued again" in failed["detail"]
        third = claim(c, "cq-lapse", name="third").json()
        released = finish(c, third, third["claim"], status="released", name="third").json()
        assert (released["status"], released["attempts"]) == ("queued", 2)  # a released claim does not count


def test_a_certifier_killed_mid_job_loses_it_and_three_deaths_end_it_as_crash(server: Server, tmp_path: Path) -> None:
    plaintext = token(server, "cq-killed", ["cq-kill"])
    with server.client("publish") as c:
        doc = publish(c, "cq-kill")
    key = doc["kernel_key"]
    f = facts("cq-kill")
    sku = Sku("cq-kill", f["arch"], f["sm_count"], f["l2_bytes"], f["cuda_major"], host=f["host"])
    for attempt in (1, 2, 3):  # each claims the job (after the last one's lease ran out), then is SIGKILLed
        proc = _certifier(server, plaintext, tmp_path / f"store{attempt}", sku, f"dies{attempt}")
        try:
            line = _first_line(proc, timeout=60)
            assert json.loads(line) == {"certifying": [key]}
            job = job_of(server, key)
            assert (job["status"], job["attempts"], job["certifier"]) == ("running", attempt, f"dies{attempt}")
            assert Store(tmp_path / f"store{attempt}").has_entry(key)  # it fetched the kernel it certifies
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    job = _after_lease(server, key)
    with as_token(server, plaintext) as c:
        assert claim(c, "cq-kill", name="next").status_code == 204  # ended: no longer claimed
    job = job_of(server, key)
    assert (job["status"], job["verdict"], job["attempts"], job["lapses"]) == ("failed", "crash", 3, 3)
    assert "stopped answering 3 times" in job["detail"]
    with server.client() as c:
        listed = c.get("/v1/verdicts", params={"kernel_key": key}).json()
    assert [(v["device"], v["status"]) for v in listed] == [(DEVICE, "crash")]


def _certifier(server: Server, plaintext: str, store: Path, sku: Sku, name: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    env.update(PYTHONPATH=str(ROOT), FA4_AOT_INSECURE="1")  # the test's kernels are unsigned
    args = [server.url, plaintext, str(store), sku_arg(sku), name, DEVICE, "10"]
    with open(store.parent / f"{name}.log", "w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "tests.helpers.certifiers", *args], cwd=ROOT, env=env,
                                text=True, stdout=subprocess.PIPE, stderr=log)


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The process's first line of stdout (it prints one once it is certifying), or fail naming its log."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"the certifier did not claim the job within {timeout} s (exit {proc.poll()})")
    return proc.stdout.readline()


def _after_lease(server: Server, key: str) -> dict[str, Any]:
    """The job once its lease ran out (at most 15 s from now)."""
    end = time.monotonic() + 15
    while time.monotonic() < end:
        job = job_of(server, key)
        lease = job["lease_until"]
        if lease is None or time.time() > _epoch(lease):
            return job
        time.sleep(0.5)
    pytest.fail("the dead certifier's lease never ran out")


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_kernels_a_build_wrote_before_serve_are_queued_for_certification(launch: Launch, tmp_path: Path) -> None:
    """Issue 27: `fa4-aot build` then `fa4-aot serve` over its store is how most kernels reach a server; those
    the server imports at startup are certified as builders' uploads are, except kernels already certified."""
    from fa4_aot.domain.verdicts import Verdict
    from fa4_aot.store import Entry
    from tests.conftest import proven

    store = Store(tmp_path / "built")
    sku = Sku(name="h200", **{k: v for k, v in H200.items() if k != "sku"})
    entries = []
    for i in range(3):
        data = b"built-kernel-%d" % i
        entry = proven(Entry(kernel_key="", object_digest=store.put_object(data), size=len(data),
                             family="FlashAttentionForwardSm90", compile_key=["fwd", i], sku=sku.name, arch=sku.arch,
                             sm_count=sku.sm_count, l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major,
                             toolchain={"flash-attn-4": "4.0.0b36"}, variant="v", call="c", compile_seconds=0.0,
                             host=sku.host))
        store.put_entry(entry)
        entries.append(entry)
    store.put_verdicts([Verdict(kernel_key=entries[0].kernel_key, device=DEVICE, status="pass", checks=1,
                                toolchain="t", when="2026-12-03T10:00:00Z")])
    server = launch(cache_dir=store.root)
    with server.client() as c:
        jobs = c.get("/v1/certify-jobs", params={"sku": "h200"}).json()
    assert sorted(j["kernel_key"] for j in jobs) == sorted(e.kernel_key for e in entries[1:])
    assert {j["status"] for j in jobs} == {"queued"}
    server.kill()
    server.start()  # imported again at the next start: no second job
    with server.client() as c:
        assert len(c.get("/v1/certify-jobs", params={"sku": "h200"}).json()) == 2
