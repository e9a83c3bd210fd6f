"""The Ray executor on a real two-node Ray cluster on loopback (head + a second node, one CPU each): the same
kernels and bytes as a local build, for a CUDA 13 and a CUDA 12 SKU (each built in its own environment); a worker
killed mid-build; a driver killed mid-build and a re-run that builds only what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fa4_aot.compile import flavours
from fa4_aot.config import host_arch
from fa4_aot.domain import kernel_keys
from fa4_aot.errors import BuildError
from fa4_aot.store import Store
from fa4_aot.store.maintenance import verify
from tests.conftest import ROOT, TINY_VARIANTS, run_cli
from tests.helpers.ray_cluster import CLUSTER_ENV, RayCluster
from tests.helpers.servers import Server, prepare_database

pytest.importorskip("ray", reason="the farm extra is not installed: pip install -e '.[farm]'")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TWO_SKUS = "h200,h200-cu12"


def _need_cu12() -> None:
    try:
        flavours.python_for(12)
    except BuildError as e:
        if os.environ.get("CI"):
            raise  # .ci/run makes .venv-cu12: in CI its absence is a failure, not a skip
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    c = RayCluster((1, 1))
    try:
        yield c
    finally:
        c.stop()


def _args(cluster: RayCluster, sku: str, only: str) -> list[str]:
    return ["build", "--sku", sku, "--variants", str(TINY_VARIANTS), "--only", only, "--json", "--executor", "ray",
            "--ray-address", cluster.address, "--ray-node-ip", "127.0.0.1"]


def _docs(result: subprocess.CompletedProcess[str]) -> list[dict]:
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    doc = json.loads(result.stdout)
    return doc if isinstance(doc, list) else [doc]


def _objects(store: Path) -> dict[str, tuple[str, str, str]]:
    """Per kernel (its full key, as reports name it): SKU, object digest, compiler flavour. A kernel that consumed
    SKU constants has two entries, its full key's and its base key's signpost; both name the same kernel."""
    return {kernel_keys.entry_keys(e)[1]: (e.sku, e.object_digest, e.toolchain["cutlass-dsl-cuda"])
            for e in Store(store).entries()}


def _libraries(store: Path) -> dict[str, dict[str, int | None]]:
    """Per entry: the lean-runtime library linked for this host and the runtime libraries it needs."""
    return {e.kernel_key: e.lib_digests(host_arch()) for e in Store(store).entries()}


def test_ray_build_equals_local_build_for_two_skus_and_flavours(cluster: RayCluster, tmp_path: Path) -> None:
    _need_cu12()
    local = _docs(run_cli("build", "--sku", TWO_SKUS, "--variants", str(TINY_VARIANTS), "--only", "full-fwd",
                          "--json", cache=tmp_path / "local"))
    # the driver has no linker (no gcc on its PATH): the workers link each kernel's library, the driver only stores
    no_linker = {**CLUSTER_ENV, "PATH": str(Path(sys.executable).parent)}
    farm = _docs(run_cli(*_args(cluster, TWO_SKUS, "full-fwd"), cache=tmp_path / "ray", env=no_linker))
    assert [d["sku"] for d in farm] == ["h200", "h200-cu12"]
    assert [d["lean_failures"] for d in farm] == [[], []]
    libraries = _libraries(tmp_path / "ray")
    assert all(libraries.values()) and libraries == _libraries(tmp_path / "local")
    assert [d["kernel_keys"] for d in farm] == [d["kernel_keys"] for d in local]
    assert all(d["failed"] == 0 and d["built"] == d["kernels"] >= 1 for d in farm + local)
    objects = _objects(tmp_path / "ray")
    assert objects == _objects(tmp_path / "local")  # same keys, same object bytes (digests)
    assert {sku: flavour for sku, _digest, flavour in objects.values()} == {"h200": "cu13", "h200-cu12": "cu12"}
    assert verify(Store(tmp_path / "ray")).ok


def test_workers_push_kernels_with_their_libraries_to_a_server(cluster: RayCluster, tmp_path: Path) -> None:
    """--push: the workers publish each kernel, its library and the runtime library it needs; a client that pulls
    the SKU gets what a local build makes, libraries included."""
    db_url = f"sqlite:///{tmp_path / 'server.db'}"
    server = Server(cache_dir=tmp_path / "server-store", db_url=db_url, log=tmp_path / "server.log",
                    tokens=prepare_database(db_url)).start()
    try:
        [doc] = _docs(run_cli(*_args(cluster, "h200", "full-fwd"), "--push", server.url, "--token",
                              server.tokens["publish"], cache=tmp_path / "driver", env=CLUSTER_ENV))
        assert doc["failed"] == 0 and doc["built"] == doc["kernels"] >= 1
        pulled = run_cli("pull", "--server", server.url, "--sku", "h200", "--json", cache=tmp_path / "client",
                         env={"FA4_AOT_INSECURE": "1"})
        assert pulled.returncode == 0 and json.loads(pulled.stdout)["failures"] == [], pulled.stderr[-2000:]
    finally:
        server.kill()
    local = _docs(run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--json",
                          cache=tmp_path / "local"))
    assert local[0]["kernel_keys"] == doc["kernel_keys"]
    assert _objects(tmp_path / "client") == _objects(tmp_path / "local")
    libraries = _libraries(tmp_path / "client")
    assert all(libraries.values()) and libraries == _libraries(tmp_path / "local")
    assert verify(Store(tmp_path / "client")).ok


def _start(cluster: RayCluster, store: Path) -> subprocess.Popen[str]:
    env = {**os.environ, **CLUSTER_ENV, "FA4_AOT_CACHE": str(store)}
    return subprocess.Popen([sys.executable, "-m", "fa4_aot", *_args(cluster, "h200", "det-bwd")], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(what: str, check: object, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_worker_killed_mid_build_is_retried_and_every_kernel_is_built(cluster: RayCluster, tmp_path: Path) -> None:
    proc = _start(cluster, tmp_path)
    try:
        _wait_for("a first kernel", lambda: any(Store(tmp_path).entries()))
        _wait_for("a compile task", lambda: cluster.worker_pids())
        victim = cluster.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    [doc] = _docs(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert doc["failed"] == 0 and doc["built"] == doc["kernels"] >= 3, doc
    assert set(_objects(tmp_path)) == set(doc["kernel_keys"])
    assert verify(Store(tmp_path)).ok


def test_driver_killed_then_rerun_builds_only_what_is_missing(cluster: RayCluster, tmp_path: Path) -> None:
    """A kernel killed between its base-key signpost and its full entry (written last, the commit) is not built
    yet: only kernels with their full entry count as present."""
    proc = _start(cluster, tmp_path)
    try:
        _wait_for("a first kernel", lambda: any(not e.is_signpost for e in Store(tmp_path).entries()))
    finally:
        proc.kill()  # the driver alone: the cluster lives on and drops the dead job's tasks
        proc.communicate()
    before = {e.kernel_key for e in Store(tmp_path).entries() if not e.is_signpost}
    assert verify(Store(tmp_path)).ok  # no partial entry: every entry that exists is complete
    [doc] = _docs(run_cli(*_args(cluster, "h200", "det-bwd"), cache=tmp_path, env=CLUSTER_ENV))
    assert doc["failed"] == 0 and doc["kernels"] >= 3
    assert doc["present"] == len(before) >= 1 and doc["built"] == doc["kernels"] - len(before) >= 1
    assert set(doc["kernel_keys"]) == set(_objects(tmp_path)) > before
