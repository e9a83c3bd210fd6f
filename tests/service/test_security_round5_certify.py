"""Security round 5, certify jobs over SQLite and PostgreSQL with a real uvicorn: a kernel certified on one device
class is certified again when a certifier on another device class of the same GPU (another driver or CUDA) asks,
in a job of its own; a device class that has its verdict, or its job, gets none twice."""

from __future__ import annotations

from tests.helpers.certifiers import DEVICE, OTHER_DEVICE, as_token, claim, finish, publish, token, verdict
from tests.helpers.servers import Server


def test_a_second_device_class_of_the_same_gpu_gets_its_own_certify_job(server: Server) -> None:
    certifier = token(server, "r5-cq", ["r5-cq"])
    with server.client("publish") as c:
        key = publish(c, "r5-cq")["kernel_key"]
    with as_token(server, certifier) as c:
        first = claim(c, "r5-cq", device=DEVICE)
        assert first.status_code == 200, first.text
        assert finish(c, first.json(), first.json()["claim"], verdicts=[verdict(key)]).status_code == 200
        assert claim(c, "r5-cq", device=DEVICE).status_code == 204  # certified on this class: nothing to do
        second = claim(c, "r5-cq", device=OTHER_DEVICE)  # the same GPU under another driver and CUDA
        assert second.status_code == 200, second.text
        job = second.json()
        assert (job["kernel_key"], job["device"], job["status"]) == (key, OTHER_DEVICE, "running")
        assert job["id"] != first.json()["id"]
        assert claim(c, "r5-cq", device=OTHER_DEVICE).status_code == 204  # its job is taken: not made twice
        done = finish(c, job, job["claim"], verdicts=[verdict(key, "wrong", OTHER_DEVICE, tensor="dq", error=1.0,
                                                              bound=0.1)])
        assert done.status_code == 200, done.text
        assert claim(c, "r5-cq", device=OTHER_DEVICE).status_code == 204
    with server.client() as c:
        rows = c.get("/v1/verdicts", params={"kernel_key": key}).json()
        jobs = c.get("/v1/certify-jobs", params={"kernel_key": key}).json()
    assert sorted((r["device"], r["status"]) for r in rows) == sorted([(DEVICE, "pass"), (OTHER_DEVICE, "wrong")])
    assert sorted(j["device"] for j in jobs) == sorted([DEVICE, OTHER_DEVICE])
