"""On a GPU: the lean runtime in a fresh process with an empty cache, FA4_AOT_SERVER and FA4_AOT_TRUSTED_KEYS set,
fetches its recipe file and its kernels' linked libraries from the server and runs a training call, bitwise equal
to the same call over the local store, never importing the compiler stack; a recipe file the server swapped is
refused. Uses test_h200_server's signed copy of the store and its `fa4-aot serve` (FA4_AOT_CACHE must hold the
lean tests' store: `fa4-aot build --sku h200 --variants tests/data/lean_variants.toml`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.gpu import test_h200_server as _served

server, signed = _served.server, _served.signed  # its fixtures: a signed copy of the store, served and pushed

pytestmark = pytest.mark.gpu

LEAN = r"""
import hashlib, json, sys, torch, fa4_aot
torch.manual_seed(0)
q, k, v = (torch.randn(2, 1024, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
out, lse = fa4_aot.flash_attn_func(q, k, v, causal=True, deterministic=True)  # bitwise from run to run
out.sum().backward()
torch.cuda.synchronize()
digest = hashlib.sha256(b"".join(t.detach().float().cpu().numpy().tobytes() for t in (out, q.grad, k.grad, v.grad)))
print(json.dumps({"digest": digest.hexdigest(),
                  "imported": sorted(m for m in sys.modules if m.split(".")[0] in ("cutlass", "flash_attn", "quack"))}))
"""


def _lean(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LEAN], env={**os.environ, **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_lean_runtime_on_an_empty_cache_fetches_from_the_server_under_trusted_keys(server, signed, tmp_path: Path):
    local = _lean({"FA4_AOT_CACHE": signed["store"], "FA4_AOT_OFFLINE": "1"})
    assert local.returncode == 0, local.stderr[-3000:]
    fetched = _lean({"FA4_AOT_CACHE": str(tmp_path / "empty"), "FA4_AOT_SERVER": server,
                     "FA4_AOT_TRUSTED_KEYS": signed["public"]})
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    got, want = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (fetched, local))
    assert got == want and got["imported"] == []
    assert list((tmp_path / "empty" / "recipes").rglob("*.json"))


def test_a_recipe_file_the_server_swapped_is_refused(server, signed, tmp_path: Path):
    from fa4_aot.domain import recipe_file
    from fa4_aot.store import Store

    store = Store(Path(signed["store"]))
    files = sorted((Path(signed["store"]) / "recipes").rglob("*.json"))
    originals = {f: f.read_bytes() for f in files}
    for data in originals.values():  # a compromised server: same key, other regions (one region dropped), a
        doc = recipe_file.decode(data)  # well-formed file (recipe_format admits it) that no manifest lists
        regions = doc["regions"][:-1] or doc["regions"]
        store.put_recipes(doc["key"], recipe_file.encode(doc["key"], regions))
    try:
        out = _lean({"FA4_AOT_CACHE": str(tmp_path / "empty"), "FA4_AOT_SERVER": server,
                     "FA4_AOT_TRUSTED_KEYS": signed["public"]})
    finally:
        for f, data in originals.items():
            f.write_bytes(data)
    assert out.returncode != 0 and "recipe file" in out.stderr and "listed" in out.stderr, out.stderr[-3000:]
    assert not list((tmp_path / "empty" / "recipes").rglob("*.json"))
