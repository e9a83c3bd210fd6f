"""A GPU host installs the client from the project's own server: this checkout's wheel, served by a real uvicorn
as a PEP 503 simple index (/simple/), `pip install --index-url http://SERVER/simple fa4-aot` into a fresh venv,
and the lean runtime's API imported from that install (import only: no GPU).

Regression: `pip install fa4-aot` found no distribution (the package is on no index) and nothing said how a GPU
host inside a cluster, with no internet, gets the client."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import ROOT, Server, prepare_database

pytestmark = pytest.mark.timeout(300)


def _sources(into: Path) -> Path:
    """What the wheel is built from, copied (pip builds in place: the working tree gets no build/ folder)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("fa4_aot", "service"):
        shutil.copytree(ROOT / name, into / name, ignore=skip)  # symlinks followed: variants.toml ships as a file
    for name in ("pyproject.toml", "README.md", "variants.toml"):
        shutil.copy(ROOT / name, into / name)
    return into


def _pip(*args: str, python: Path | None = None) -> subprocess.CompletedProcess[str]:
    """pip, isolated from this host's pip configuration and indexes."""
    target = ["--python", str(python)] if python else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "pip", *target, "--isolated", "--disable-pip-version-check",
                           "--no-cache-dir", *args], capture_output=True, text=True, env=env, timeout=240)


def test_the_client_wheel_installs_from_the_servers_simple_index(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(_sources(tmp_path / "src")))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = wheels.glob("fa4_aot-*.whl")

    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    server = Server(cache_dir=tmp_path / "store", db_url=db_url, log=tmp_path / "server.log",
                    env={"FA4_AOT_WHEELS_DIR": str(wheels)}, tokens=prepare_database(db_url)).start()
    try:
        assert 'href="fa4-aot/"' in httpx.get(f"{server.url}/simple/").text
        page = httpx.get(f"{server.url}/simple/fa4-aot/").text  # pip asks for the normalized name
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert f'href="{wheel.name}#sha256={digest}"' in page, page
        assert httpx.get(f"{server.url}/simple/fa4_aot/").status_code == 200  # any spelling of the name
        assert httpx.get(f"{server.url}/simple/fa4-aot/..%2Ffa4-aot.db").status_code == 404

        venv = tmp_path / "gpu-host"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        python = venv / "bin" / "python"
        installed = _pip("install", "--no-deps", "--index-url", f"{server.url}/simple", "fa4-aot", python=python)
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    finally:
        server.kill()

    # the host's dependencies (torch, tvm_ffi...) come from this test's environment, as a plain path: neither its
    # editable install of this checkout nor its other .pth files are read, so fa4_aot can come only from the wheel
    fresh = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(fresh, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = ("import fa4_aot, fa4_aot.runtime.api as api; print(fa4_aot.__file__); "
             "print(callable(api.load), callable(api.flash_attn_func), fa4_aot.__version__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    where, api_line = ran.stdout.splitlines()[-2:]
    assert Path(where).is_relative_to(venv), where
    assert re.fullmatch(r"True True \S+", api_line), api_line
