"""Prefetch by model (issue 21, point 3) against a real server over a real build: `fa4-aot pull --model` and
`fa4_aot.prefetch` fetch exactly the model's kernel set (recipe files, kernels, this host's libraries; the kernels
in one bundle) into an empty store, in a process that never imports FA4; what the server lacks is reported to it
as misses (which it queues as build jobs). Also: `pull --sku` with a typo is an error with a suggestion (issue 22,
point 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fa4_aot.client import prefetch
from fa4_aot.config import default_variants_file, host_arch
from fa4_aot.domain.misses import LEAN_FAMILY, Miss
from fa4_aot.domain.verdicts import Verdict
from fa4_aot.matrix import models, modelwork
from fa4_aot.matrix.variants import load
from fa4_aot.store import Store
from fa4_aot.store import recipes as recipe_store
from tests.conftest import ROOT, copy_store, run_cli
from tests.helpers.servers import Launch

pytestmark = pytest.mark.slow
MODEL = ["--model", "llama-3.1-8b", "--tp", "1"]
DEVICE, OTHER_DEVICE = "nvidia-h200.132sm.driver-13.0.cuda-13.0", "nvidia-h200.132sm.driver-12.8.cuda-12.8"
INSECURE = {"FA4_AOT_INSECURE": "1"}  # no trusted keys here: remote kernels are taken unsigned


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_h200_full_fwd: Path) -> tuple[Path, set[str]]:
    """A build store holding another variant's kernel (the session's tiny full-fwd store) and the model's prefill
    kernels: (its folder, the model's kernel keys as its build reported them)."""
    root = copy_store(tiny_h200_full_fwd, tmp_path_factory.mktemp("model-build") / "store")
    done = run_cli("build", "--sku", "h200", *MODEL, "--workload", "prefill", "--json", cache=root)
    assert done.returncode == 0, done.stderr[-3000:]
    keys = set(json.loads(done.stdout)["kernel_keys"])
    kernels = {e.kernel_key for e in Store(root).entries() if not e.is_signpost}
    assert kernels - keys, "the server must hold kernels beyond the model's, or 'exactly' proves nothing"
    return root, keys


def _model_recipes(sku_name: str, workloads: tuple[str, ...]) -> set[str]:
    sku = load(default_variants_file()).skus[sku_name]
    sigs = {i.signature for i in modelwork.items(models.resolve("llama-3.1-8b"), (1,), workloads)}
    return {recipe_store.recipe_key(s, sku) for s in sigs}


def test_pull_model_fetches_exactly_its_kernel_set_in_one_bundle(built: tuple[Path, set[str]], launch: Launch,
                                                                 tmp_path: Path) -> None:
    root, keys = built
    server = launch(cache_dir=root)
    node = tmp_path / "node"
    done = run_cli("pull", "--server", server.url, "--sku", "h200", *MODEL, "--workload", "prefill", "--json",
                   cache=node, env=INSECURE)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["complete"] and doc["bundles"] == 1 and doc["fetched"] == doc["kernels"] and doc["reported"] == 0
    build, pulled = Store(root), Store(node)
    entries = list(pulled.entries())
    assert {e.kernel_key for e in entries if not e.is_signpost} == keys
    arch = host_arch()
    for e in entries:  # byte-identical kernels, each with this host's library and the runtime libraries it needs
        assert e.object_digest == build.get_entry(e.kernel_key).object_digest
        assert pulled.has_library(e, arch)
    assert {p.stem for p in (node / "recipes").glob("??/*.json")} == _model_recipes("h200", ("prefill",))
    for p in (node / "recipes").glob("??/*.json"):
        assert p.read_bytes() == build.recipes(p.stem)
    again = run_cli("pull", "--server", server.url, "--sku", "h200", *MODEL, "--workload", "prefill", "--json",
                    cache=node, env=INSECURE)
    assert again.returncode == 0 and json.loads(again.stdout)["fetched"] == 0 == json.loads(again.stdout)["bundles"]


def test_pull_model_keeps_the_servers_certification_verdicts_of_its_kernels_only(
        built: tuple[Path, set[str]], launch: Launch, tmp_path: Path) -> None:
    """Issue 27: a node prefetched by model must know which of its kernels are certified (or failed) as a node
    pulled by SKU does; verdicts of kernels outside the model stay on the server."""
    root, keys = built
    served = copy_store(root, tmp_path / "served")
    others = sorted(e.kernel_key for e in Store(served).entries() if not e.is_signpost and e.kernel_key not in keys)
    mine = sorted(keys)
    Store(served).put_verdicts([Verdict(kernel_key=k, device=DEVICE, status="pass", checks=2, toolchain="t",
                                        when="2026-12-03T10:00:00Z") for k in mine + others[:1]]
                               + [Verdict(kernel_key=mine[0], device=OTHER_DEVICE, status="wrong", tensor="dq",
                                          error=0.5, bound=0.01, toolchain="t", when="2026-12-03T10:00:00Z")])
    server = launch(cache_dir=served)
    node = tmp_path / "node"
    done = run_cli("pull", "--server", server.url, "--sku", "h200", *MODEL, "--workload", "prefill", "--json",
                   cache=node, env=INSECURE)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout)["verdicts"] == len(mine) + 1
    pulled = Store(node)
    assert set(pulled.verdict_keys()) == set(mine)
    assert {(v.device, v.status) for v in pulled.verdicts(mine[0])} == {(DEVICE, "pass"), (OTHER_DEVICE, "wrong")}


def test_what_the_server_lacks_is_reported_as_misses_and_the_pull_fails(built: tuple[Path, set[str]],
                                                                        launch: Launch, tmp_path: Path) -> None:
    root, _keys = built
    server = launch(cache_dir=root)
    done = run_cli("pull", "--server", server.url, "--sku", "h200", *MODEL, "--workload", "prefill,decode",
                   cache=tmp_path / "node", env=INSECURE)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    model = models.resolve("llama-3.1-8b")
    prefill = {i.signature for i in modelwork.items(model, (1,), ("prefill",))}
    unbuilt = [i for i in modelwork.items(model, (1,), ("decode",)) if i.signature not in prefill]
    assert unbuilt and sorted(line for line in done.stdout.splitlines() if line.startswith("unbuilt")) == sorted(
        f"unbuilt on the server: {i.label}" for i in unbuilt)
    assert f"{len(unbuilt)} reported to it as misses" in done.stdout
    misses = httpx.get(f"{server.url}/v1/misses", headers={"Authorization": f"Bearer {server.tokens['read']}"},
                       timeout=30).json()
    expected = {Miss.lean(prefetch._call(i.signature), "h200").kernel_key for i in unbuilt}
    assert {m["kernel_key"] for m in misses} == expected
    assert {m["family"] for m in misses} == {LEAN_FAMILY}
    # the prefill part still came: a node gets what exists at once
    assert len([e for e in Store(tmp_path / "node").entries() if not e.is_signpost]) == len(_keys)


PREFETCH = r"""
import json, sys
import fa4_aot
r = fa4_aot.prefetch("llama-3.1-8b", tp=1, workloads=["prefill"], server=sys.argv[1], cache_dir=sys.argv[2])
print(json.dumps({**r.to_dict(),
                  "imported": sorted({m.split(".")[0] for m in sys.modules} & {"cutlass", "flash_attn", "quack"})}))
"""


def test_prefetch_in_python_needs_no_fa4_and_picks_the_sku_as_the_runtimes_do(built: tuple[Path, set[str]],
                                                                                 launch: Launch,
                                                                                 tmp_path: Path) -> None:
    root, keys = built
    server = launch(cache_dir=root)
    env = {**INSECURE, "FA4_AOT_SKU": "h200", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PREFETCH, server.url, str(tmp_path / "node")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["imported"] == [] and doc["complete"] and doc["sku"] == "h200"
    assert doc["fetched"] == len(keys) and doc["bundles"] == 1
    refused = subprocess.run([sys.executable, "-c", PREFETCH, server.url, str(tmp_path / "other")],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, "FA4_AOT_SKU": "h200", "PYTHONPATH": str(ROOT)})
    assert refused.returncode == 1 and "FA4_AOT_INSECURE" in refused.stderr, refused.stderr[-2000:]


def test_pull_of_an_unknown_sku_suggests_the_table_and_the_servers_names(built: tuple[Path, set[str]],
                                                                          launch: Launch, tmp_path: Path) -> None:
    """Issue 22, point 7: `pull --sku h20` said to build SKU "h20"."""
    server = launch(cache_dir=built[0])
    for args in (["--sku", "h20"], ["--sku", "h20", *MODEL]):
        done = run_cli("pull", "--server", server.url, *args, cache=tmp_path / "node", env=INSECURE)
        assert done.returncode == 1 and "unknown SKU 'h20'; did you mean 'h200'" in done.stderr, done.stderr
        assert "fa4-aot build --sku h20" not in done.stderr and "Traceback" not in done.stderr
    absent = run_cli("pull", "--server", server.url, "--sku", "b200", *MODEL, cache=tmp_path / "node", env=INSECURE)
    assert absent.returncode == 1 and "holds no kernel of SKU b200" in absent.stderr, absent.stderr
    assert "fa4-aot build --sku b200 --model llama-3.1-8b --tp 1" in absent.stderr
