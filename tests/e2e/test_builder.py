"""On-demand builds end to end on a CPU (issue 21, point 4): a real uvicorn server, real `fa4-aot builder`
processes compiling with FA4, lean-runtime clients that miss a call, wait (FA4_AOT_BUILD_WAIT) and are served
what the builder published, with nothing compiled on the client.

SQLite only: each build costs a real compile; the queue's database logic runs over both backends in
test_builder_queue.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fa4_aot.domain.misses import Miss
from fa4_aot.errors import KernelMissing
from fa4_aot.remote import wait as build_wait
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from fa4_aot.trust import signing_keys
from tests.helpers.builders import BuilderProcess, hold_sku, jobs, lean_client, served, tiny, wait_until
from tests.helpers.servers import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def new_db_url() -> Callable[[Path], str]:
    return lambda folder: f"sqlite:///{folder / 'fa4-aot.db'}"


@pytest.fixture
def builders(tmp_path: Path, server: Server) -> Iterator[Callable[..., BuilderProcess]]:
    made: list[BuilderProcess] = []

    def start(lease: float = 60.0, cache: Path | None = None, signing_key: Path | None = None) -> BuilderProcess:
        b = BuilderProcess(server, cache or tmp_path / "builder", tmp_path / f"builder{len(made)}.log", lease,
                           signing_key)
        made.append(b.start())
        return b

    hold_sku(server)
    yield start
    for b in made:
        b.kill()
    for b in made:  # a thread that died (a lease renewal, say) prints its traceback and nothing else
        assert "Traceback" not in b.log.read_text(), b.log.read_text()[-3000:]


def job_of(server: Server, call: Any) -> dict[str, Any]:
    key = Miss.lean(call, "h200").kernel_key
    found = [j for j in jobs(server) if j["kernel_key"] == key]
    assert len(found) <= 1, found
    return found[0] if found else {}


def test_a_lean_miss_is_built_once_then_served_without_compiling(server: Server, builders: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    call = tiny(batch=3)
    client = lean_client(server, tmp_path / "client")
    with pytest.raises(KernelMissing, match="build --from-misses"):  # no wait: the miss raises at once
        served(client, call)
    builders()
    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", "300")
    region = served(lean_client(server, tmp_path / "client"), call)
    job = job_of(server, call)
    assert job["status"] == "done" and job["built"] >= len(region.kernels) >= 1, job  # its whole signature
    assert job["reports"] == 2 and job["attempts"] == 1, job
    client_store = Store(tmp_path / "client")
    assert all(e.compile_seconds > 0 for e in client_store.entries())  # fetched, as the builder compiled them
    assert [m.family for m in client_store.misses()] == ["recipe"]  # recorded locally too, with its call
    text = httpx.get(f"{server.url}/metrics").text
    assert "fa4_aot_build_miss_to_publish_seconds_count 1.0" in text and 'fa4_aot_build_jobs{status="done"}' in text


def test_32_clients_missing_one_call_cause_one_compile(server: Server, builders: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    call = tiny(batch=5)
    miss = Miss.lean(call, "h200")
    answers: list[Any] = [None] * 32

    def client(i: int) -> None:
        answers[i] = build_wait.wait(Remote(server.url), miss, 300)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    wait_until(lambda: job_of(server, call).get("reports") == 32, 60, "32 reports of one job")
    private, public = signing_keys.generate(tmp_path / "keys", "builder")
    builders(signing_key=private)
    for t in threads:
        t.join(330)
    assert [problem for _job, problem in answers] == [""] * 32
    job = job_of(server, call)
    assert job["status"] == "done" and job["reports"] == 32 and job["attempts"] == 1, job
    assert job["built"] >= 1 and len({j.id for j, _p in answers}) == 1
    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", "30")
    # a late client that trusts only the builder's key is served (its manifest lists the kernel, the library and
    # the recipe file), and nothing more is built
    served(lean_client(server, tmp_path / "late", trusted=signing_keys.trusted_keys(public.line())), call)
    assert job_of(server, call)["built"] == job["built"] and len(jobs(server)) == len({j["id"] for j in jobs(server)})


def test_a_builder_killed_mid_job_is_taken_over_after_its_lease(server: Server, builders: Any,
                                                                 tmp_path: Path) -> None:
    call = tiny(batch=7)
    job, _why = Remote(server.url).request_build(Miss.lean(call, "h200"))
    first = builders(lease=10.0)
    wait_until(lambda: job_of(server, call).get("status") == "running", 60, "the builder to claim the job")
    first.kill()  # mid-job: planning or compiling, its workers with it
    assert job_of(server, call)["status"] == "running"  # still leased to the dead builder
    builders(lease=10.0, cache=tmp_path / "builder")  # its restart, on the same store
    done = wait_until(lambda: job_of(server, call) if job_of(server, call)["status"] in ("done", "failed") else None,
                      300, "the restarted builder to finish the job")
    assert done["status"] == "done" and done["attempts"] == 2 and job is not None and done["id"] == job.id, done
    served(lean_client(server, tmp_path / "client"), call)


def test_a_builder_keeps_its_lease_while_it_builds(server: Server, builders: Any, tmp_path: Path) -> None:
    """Regression: the lease renewals ran in a thread that died at once (it made its Remote through the CLI's
    click context, which threads do not have), so a job longer than the lease went to the next claim."""
    call = tiny(batch=15)
    Remote(server.url).request_build(Miss.lean(call, "h200"))
    builders(lease=10.0)
    wait_until(lambda: job_of(server, call).get("status") == "running", 60, "the builder to claim the job")
    thief: list[int] = []
    with server.client("publish") as c:
        while job_of(server, call)["status"] in ("queued", "running"):
            answer = c.post("/v1/build-claims", json={"builder": "thief", "lease_seconds": 60})
            if answer.status_code == 200:
                thief.append(answer.json()["id"])
                break
            time.sleep(0.3)
    done = job_of(server, call)
    assert not thief and done["status"] == "done" and done["attempts"] == 1, (thief, done)
    assert done["finished"] and done["started"]  # renewed every third of its 10 s lease (the shortest allowed)


def test_broken_and_malicious_misses_cost_one_bounded_answer(launch: Any, tmp_path: Path) -> None:
    server = launch(build_queue_per_token="2")
    hold_sku(server)
    good = Miss.lean(tiny(batch=9), "h200").to_dict()
    with server.client("publish") as c:
        assert c.post("/v1/misses", json=good).status_code == 202
        # unknown SKU (the miss's own key for it): 404 and no job; the h200 key under another SKU is forged: 422
        assert c.post("/v1/misses", json=Miss.lean(tiny(batch=9), "nosuch").to_dict()).status_code == 404
        assert c.post("/v1/misses", json={**good, "sku": "nosuch"}).status_code == 422
        # an oversized call: refused before it is read (413), no job
        assert c.post("/v1/misses", json={**good, "args": {"x": "y" * 200_000}}).status_code == 413
        # a flood from one token: past its 2 queued jobs each miss is recorded, answered once, and queues nothing
        flood = [Miss.lean(tiny(batch=100 + i), "h200").to_dict() for i in range(6)]
        answers = [c.post("/v1/misses", json=m).json() for m in flood]
    assert [a["build"] is not None for a in answers] == [True] + [False] * 5
    assert all("FA4_AOT_BUILD_QUEUE_PER_TOKEN" in a["detail"] for a in answers[1:])
    with server.client("read") as c:  # another token still queues
        assert c.post("/v1/misses", json=flood[-1]).json()["build"]["status"] == "queued"
    assert sorted(j["status"] for j in jobs(server)) == ["queued"] * 3


def test_a_call_fa4_rejects_is_answered_with_its_reason_and_not_built_again(
        server: Server, builders: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    call = tiny(head_dim=512, head_dim_v=512)  # FA4 has no kernel for head dim 512
    builders()
    monkeypatch.setenv("FA4_AOT_BUILD_WAIT", "300")
    with pytest.raises(KernelMissing, match="FA4 rejects this call") as first:
        served(lean_client(server, tmp_path / "a"), call)
    job = job_of(server, call)
    assert job["status"] == "rejected" and job["attempts"] == 1 and job["built"] == 0, job
    assert job["detail"] and job["detail"] in str(first.value)
    with pytest.raises(KernelMissing, match="FA4 rejects this call"):  # answered at once with the same reason
        served(lean_client(server, tmp_path / "b"), call)
    again = job_of(server, call)
    assert again["attempts"] == 1 and again["reports"] == 2 and again["detail"] == job["detail"]


def test_builds_command_lists_the_jobs(server: Server, builders: Any) -> None:
    from tests.conftest import run_cli

    Remote(server.url).request_build(Miss.lean(tiny(batch=11), "h200"))
    listed = run_cli("builds", "--server", server.url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert any(j["kernel_key"] == Miss.lean(tiny(batch=11), "h200").kernel_key for j in json.loads(listed.stdout))


FA4_CLIENT = r'''
import json
import fa4_aot

inst = fa4_aot.install("strict")  # FA4_AOT_SKU=h200: FA4 plans for the H200 on this CPU host
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute import flash_attn_func
from fa4_aot.fa4 import caches

found = []

class Probe(caches.StoreCache):
    """Asks the installation exactly as install()'s caches do, then lets FA4 go on without loading: fake tensors
    launch nothing."""
    def __contains__(self, key):
        if key not in self.cache:
            found.append(str(self.source.object_for(self.family, key)))
            self.cache[key] = lambda *a, **k: None
        return True

with FakeTensorMode(), caches.swapped(lambda family, _old: Probe(family, inst)), torch.no_grad():
    q = torch.empty(1, 200, 2, 64, dtype=torch.bfloat16, device="cuda")
    flash_attn_func(q, q, q, causal=True)
print(json.dumps({"objects": found, "fetched": inst.stats.fetched, "compiled": inst.stats.compiled}))
'''


def test_an_fa4_strict_miss_waits_for_the_build_and_loads_it(server: Server, builders: Any, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    builders()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    env.update(FA4_AOT_CACHE=str(tmp_path / "fa4-client"), FA4_AOT_SKU="h200", FA4_AOT_SERVER=server.url,
               FA4_AOT_INSECURE="1", FA4_AOT_BUILD_WAIT="300", TORCH_CPP_LOG_LEVEL="ERROR")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", FA4_CLIENT], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 0 and result["fetched"] == len(result["objects"]) >= 1, result
    assert all(Path(p).is_file() for p in result["objects"])
    fa4_jobs = [j for j in jobs(server) if j["family"] != "recipe"]
    assert [j["status"] for j in fa4_jobs] == ["done"] * len(fa4_jobs) and fa4_jobs, fa4_jobs
