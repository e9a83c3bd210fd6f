"""The builder on the Ray executor (issue 21, point 1): `fa4-aot builder --executor ray` runs a client's miss on
a real one-node Ray cluster on loopback, publishes it, and the waiting lean client is served."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.builders import BuilderProcess, hold_sku, jobs, lean_client, served, tiny
from tests.helpers.ray_cluster import CLUSTER_ENV, RayCluster
from tests.helpers.servers import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def new_db_url() -> Callable[[Path], str]:
    return lambda folder: f"sqlite:///{folder / 'fa4-aot.db'}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    started = RayCluster(cpus_per_node=(1,))
    yield started
    started.stop()


def test_a_miss_is_built_on_ray_and_served(server: Server, cluster: RayCluster, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    hold_sku(server)
    builder = BuilderProcess(server, tmp_path / "builder", tmp_path / "builder.log",
                             extra=("--executor", "ray", "--ray-address", cluster.address, "--ray-node-ip",
                                    "127.0.0.1"), env=CLUSTER_ENV).start()
    try:
        monkeypatch.setenv("FA4_AOT_BUILD_WAIT", "400")
        region = served(lean_client(server, tmp_path / "client"), tiny(batch=13))
    finally:
        builder.kill()
    [job] = jobs(server)
    assert job["status"] == "done" and job["built"] >= len(region.kernels) >= 1, job  # its whole signature
    assert "on ray" in (tmp_path / "builder.log").read_text()
