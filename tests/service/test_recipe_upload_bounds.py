"""Issue 28, D37 and D38, the server's side: a recipe file whose guard is a product of 60,000 copies of 2**62, whose
region names no output, or that nests 50,000 deep is refused at upload (422 naming what is wrong), against a real
uvicorn over SQLite and PostgreSQL; the compact files builds write since issue 29 are kept as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain import recipe_file
from fa4_aot.store import recipes as recipe_store
from tests.helpers.servers import Server
from tests.remote.test_lean_entries import SKU, _publish, lean_store, region

SIGNATURE: dict[str, Any] = {"layout": "dense", "head_dim": 96, "causal": True}


def _file(regions: list[Any]) -> tuple[str, bytes]:
    key = recipe_store.file_key(SIGNATURE, SKU.target_facts())
    return key, json.dumps({"key": key, "regions": regions}).encode()


@pytest.mark.bad_input("HTTP")
def test_d37_d38_server_refuses_recipes_the_runtime_cannot_run(server: Server, tmp_path: Path) -> None:
    store, [entry], _ = lean_store(tmp_path, kernels=1)
    key, _ = _file([])
    bomb = {**region(SIGNATURE), "guards": [["gt", ["mul", *[1 << 62] * 60_000], 1]]}
    no_out = {**region(SIGNATURE), "outputs": {"lse": None}}
    deep = b'{"key": "' + key.encode() + b'", "regions": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}"
    with server.client("publish") as c:
        assert _publish(c, store, entry).status_code in (200, 201)
        for data, named in ((_file([bomb])[1], "operands"), (_file([no_out])[1], "region 0: outputs name no 'out'"),
                            (deep, "nested deeper than")):
            refused = c.put(f"/v1/skus/h200/recipes/{key}", content=data)
            assert refused.status_code == 422 and named in refused.json()["detail"], refused.text[:300]
        assert c.get(f"/v1/skus/h200/recipes/{key}").status_code == 404
        compact = recipe_file.encode(key, [region(SIGNATURE)])
        assert c.put(f"/v1/skus/h200/recipes/{key}", content=compact).status_code == 201
        served = c.get(f"/v1/skus/h200/recipes/{key}")
        assert served.content == compact and served.headers["content-type"] == "application/octet-stream"
