"""docker/: the compose files parse and their services fit together. There is no Docker engine on the CI machine,
so this checks the files (YAML, names, ports, paths, commands), not a running stack."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _compose(name: str) -> dict:
    return yaml.safe_load((DOCKER / name).read_text())


@pytest.mark.parametrize("name", ["compose.yaml", "farm.compose.yaml"])
def test_every_built_image_has_its_dockerfile(name: str) -> None:
    for service in _compose(name)["services"].values():
        if "build" in service:
            assert service["build"]["context"] == ".."
            assert (DOCKER.parent / service["build"]["dockerfile"]).is_file()


def test_farm_services_point_at_each_other() -> None:
    services = _compose("farm.compose.yaml")["services"]
    assert {"db", "service", "ray-head", "ray-worker", "build"} <= set(services)
    head_port = next(a.split("=")[1] for a in services["ray-head"]["command"] if a.startswith("--port="))
    assert f"--address=ray-head:{head_port}" in services["ray-worker"]["command"]
    build = services["build"]["command"]
    assert build[:2] == ["fa4-aot", "build"] and build[build.index("--executor") + 1] == "ray"
    assert build[build.index("--ray-address") + 1] == f"ray-head:{head_port}"
    service_port = services["service"]["ports"][0].split(":")[1]
    assert build[build.index("--push") + 1] == f"http://service:{service_port}"
    db = services["db"]["environment"]
    url = f"postgresql+psycopg://{db['POSTGRES_USER']}:{db['POSTGRES_PASSWORD']}@db:5432/{db['POSTGRES_DB']}"
    assert url in services["service"]["command"]
    for name in ("ray-head", "ray-worker", "build"):  # one image: Ray wants equal Ray and Python on every node
        assert services[name]["image"] == "fa4-aot-farm" and services[name]["environment"]["RAY_AUTH_MODE"] == "token"
    assert "FA4_AOT_TOKEN" in services["build"]["environment"]


def test_farm_image_has_a_cu12_environment_where_the_farm_looks() -> None:
    dockerfile = (DOCKER / "farm.Dockerfile").read_text()
    python = re.search(r"FA4_AOT_PYTHON_CU12=(\S+)", dockerfile).group(1)  # type: ignore[union-attr]
    venv = python.removesuffix("/bin/python")
    assert f"docker/flavour-venv.sh 12 {venv}" in dockerfile and "[build,farm]" in dockerfile
    assert (DOCKER / "flavour-venv.sh").stat().st_mode & 0o111
