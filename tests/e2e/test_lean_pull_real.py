"""End to end on this CPU host with a real build: `fa4-aot push` of a build store to a real server, `fa4-aot
pull` into an empty store, then the lean runtime's loader opens every pulled library with tvm_ffi (no cutlass,
FA4 or quack in the process) and finds the recipe, every digest equal to the build store's. A lean runtime on an
empty store with a server fetches the recipe and the kernels itself, never compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.config import host_arch
from fa4_aot.domain import recipe_file
from fa4_aot.store import Store, recipes
from tests.conftest import ROOT, TINY_VARIANTS, run_cli
from tests.helpers.servers import Launch

pytestmark = pytest.mark.slow

OPEN = r"""
import json, sys
from pathlib import Path
from fa4_aot.matrix import variants
from fa4_aot.runtime import runner
from fa4_aot.domain import recipe_format
from fa4_aot.store import Store
from fa4_aot.trust.policy import Trust
from fa4_aot.domain.calls import Call
from fa4_aot.domain.signature import Signature
store, server = Store(Path(sys.argv[1])), sys.argv[2]
matrix = variants.load(Path(sys.argv[3]))
sku = matrix.skus["h200"]
[call] = matrix.variants[[v.name for v in matrix.variants].index("full-fwd")].calls(matrix.shapes["one"])
fetcher = None
if server:
    from fa4_aot.runtime.fetch import Fetcher
    from fa4_aot.remote.http import Remote
    remote = Remote(server)
    fetcher = Fetcher(remote, Trust.from_env(sku, store, remote), store)
rt = runner.Runtime(store, sku, None, None, fetcher)
attn = rt.attention(Signature.of(call))
sizes = recipe_format.sizes_of_call(call.layout, call.batch, call.seqlen_q, call.seqlen_k)
attn.preload(sizes)
names = [type(rt.libraries.function(e.kernel_key, e.family)).__name__ for e in store.entries()]
print(json.dumps({"functions": names, "regions": len(attn.regions), "fetched": fetcher.fetched if fetcher else 0,
                  "imported": sorted({m.split(".")[0] for m in sys.modules} & {"cutlass", "flash_attn", "quack"})}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lean-build")
    done = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--json",
                   cache=root)
    assert done.returncode == 0, done.stderr[-3000:]
    files = list(root.glob("recipes/*/*.json"))  # one signature: one recipe file, its regions covering every size
    assert len(files) == 1 and json.loads(done.stdout)["recipes"] == _regions(root) >= 1
    return root


def _regions(store: Path) -> int:
    """The regions of the store's one recipe file: what the lean runtime must load, locally or from a server."""
    (file,) = store.glob("recipes/*/*.json")
    return len(recipe_file.decode(file.read_bytes())["regions"])


def _open(store: Path, server: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", OPEN, str(store), server, str(TINY_VARIANTS)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "FA4_AOT_INSECURE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pulled_store_runs_the_lean_loader_with_the_build_stores_digests(built: Path, launch: Launch,
                                                                          tmp_path: Path) -> None:
    server = launch()
    pushed = run_cli("push", "--server", server.url, "--token", server.tokens["publish"], "--sku", "h200", "--json",
                     cache=built)
    assert pushed.returncode == 0 and json.loads(pushed.stdout)["recipes"] == 1, pushed.stderr[-2000:]
    pulled = run_cli("pull", "--server", server.url, "--sku", "h200", "--json", cache=tmp_path / "gpu",
                     env={"FA4_AOT_INSECURE": "1"})
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    source, copy = Store(built), Store(tmp_path / "gpu")
    for entry in source.entries():
        assert copy.get_entry(entry.kernel_key).shared_libs == entry.shared_libs
        for digest in entry.lib_digests(host_arch()):
            assert copy.object_state(digest) == "ok"
    e = next(iter(source.entries()))
    target = {"arch": e.arch, "sm_count": e.sm_count, "l2_bytes": e.l2_bytes, "cuda_major": e.cuda_major,
              "host": e.host}
    assert dict(recipes.keys_for(copy, target)) == dict(recipes.keys_for(source, target)) != {}
    report = _open(tmp_path / "gpu")
    assert report["imported"] == [] and report["regions"] == _regions(built)
    assert set(report["functions"]) == {"Function"}


def test_lean_runtime_on_an_empty_store_fetches_recipe_and_kernels_from_the_server(built: Path, launch: Launch,
                                                                                     tmp_path: Path) -> None:
    server = launch()
    assert run_cli("push", "--server", server.url, "--token", server.tokens["publish"], "--sku", "h200",
                   cache=built).returncode == 0
    report = _open(tmp_path / "empty", server.url)
    assert report["imported"] == [] and report["regions"] == _regions(built)
    assert set(report["functions"]) == {"Function"}
    assert report["fetched"] >= 2  # the recipe file and at least one kernel, in a bundle with its libraries
    assert not list((tmp_path / "empty").glob("misses/*"))  # fetched, never compiled nor recorded as a miss
