"""Certify jobs in CPU tests: requests a certifier sends (claim, renew, finish) through httpx to a real server, and
a real certifier process: fa4_aot/certify/certifier.py's loop against a real server, with the GPU run replaced by
one that announces the job's keys and then blocks, so a test can SIGKILL the process mid-job. The server, its
database, the client code (claims, lease renewals on their thread, fetching the kernels) are all real; only the
part that needs a GPU is not run.

    python -m tests.helpers.certifiers URL TOKEN STORE SKU_JSON NAME DEVICE LEASE
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from fa4_aot.certify.certifier import Certifier
from fa4_aot.domain.skus import Sku
from fa4_aot.domain.verdicts import DeviceClass, Verdict
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from service import db
from service.crud import tokens as crud_tokens
from tests.helpers.servers import H200, Server, kernel_doc

DEVICE = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
OTHER_DEVICE = "nvidia-h200.132sm.driver-12.8.cuda-12.8"


def facts(sku: str) -> dict[str, Any]:
    """H200's facts under SKU `sku`, with an L2 of its own: no other SKU shares its facts (and so its keys)."""
    return {**H200, "sku": sku, "l2_bytes": 50_000_000 + int(hashlib.sha256(sku.encode()).hexdigest()[:6], 16)}


def token(server: Server, name: str, skus: list[str] | None = None) -> str:
    with db.session_for(server.db_url) as session:
        return crud_tokens.create_token(session, name=name, scope="publish", skus=skus)


def as_token(server: Server, plaintext: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {plaintext}"}, timeout=30)


def publish(c: httpx.Client, sku: str) -> dict[str, Any]:
    data = os.urandom(512)
    doc = kernel_doc(data, **facts(sku))
    assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
    assert c.post("/v1/kernels", json=doc).status_code == 201
    return doc


def claim(c: httpx.Client, sku: str, name: str = "cert", lease: float = 10.0, device: str = DEVICE) -> httpx.Response:
    return c.post("/v1/certify-claims", json={"certifier": name, "sku": sku, "device": device, "lease_seconds": lease})


def verdict(key: str, status: str = "pass", device: str = DEVICE, **fields: Any) -> dict[str, Any]:
    return Verdict(key, device, status, checks=3, toolchain="4.0.0b36/4.8.1", **fields).to_dict()


def finish(c: httpx.Client, job: dict[str, Any], claim_id: str | None, status: str = "done",
           verdicts: list[dict[str, Any]] | None = None, name: str = "cert") -> httpx.Response:
    body: dict[str, Any] = {"certifier": name, "status": status, "verdicts": verdicts or [], "detail": "",
                            "seconds": 1.5}
    if claim_id is not None:
        body["claim"] = claim_id
    return c.post(f"/v1/certify-jobs/{job['id']}/finish", json=body)


def renew(c: httpx.Client, job: dict[str, Any], claim_id: str, name: str = "cert") -> httpx.Response:
    return c.post(f"/v1/certify-jobs/{job['id']}/lease", json={"certifier": name, "claim": claim_id,
                                                                "lease_seconds": 10})


class Blocking:
    """A certification that never ends: it prints `{"certifying": keys}` (flushed) and waits to be killed."""

    def ready(self, store: Store, sku: Sku, keys: list[str]) -> str:
        missing = [k for k in keys if not store.has_entry(k)]
        return f"kernels {missing} not fetched" if missing else ""

    def __call__(self, store: Store, sku: Sku, keys: list[str]) -> list[Verdict]:
        print(json.dumps({"certifying": keys}), flush=True)
        threading.Event().wait()
        return []


def sku_arg(sku: Sku) -> str:
    return json.dumps({"name": sku.name, "arch": sku.arch, "sm_count": sku.sm_count, "l2_bytes": sku.l2_bytes,
                       "cuda_major": sku.cuda_major, "host": sku.host})


def main() -> None:
    url, token, store, sku_json, name, device, lease = sys.argv[1:8]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    facts = json.loads(sku_json)
    sku = Sku(facts["name"], facts["arch"], facts["sm_count"], facts["l2_bytes"], facts["cuda_major"],
              host=facts["host"])
    remotes = functools.partial(Remote, url, token=token)
    worker = Certifier(remotes, Store(Path(store)), sku, DeviceClass.parse(device), name, lease=float(lease),
                       poll=0.2, certification=Blocking(), settle=10.0)
    worker.run(threading.Event(), max_jobs=1)


if __name__ == "__main__":
    main()
