"""Which interpreter builds each CUDA flavour (fa4_aot.compile.flavours), read at call time, with errors that say how to
make the missing environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fa4_aot import config
from fa4_aot.compile import flavours
from fa4_aot.errors import BuildError


def test_this_interpreter_builds_its_own_flavour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(f"FA4_AOT_PYTHON_CU{flavours.own_cuda_major()}", raising=False)
    assert flavours.python_for(flavours.own_cuda_major()) == sys.executable


def test_environment_variable_names_the_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("FA4_AOT_PYTHON_CU12", str(python))
    assert flavours.python_for(12) == str(python)
    monkeypatch.setenv("FA4_AOT_PYTHON_CU12", str(tmp_path / "nope"))
    with pytest.raises(BuildError, match=r"FA4_AOT_PYTHON_CU12=.*nope does not exist.*flavour-venv.sh 12"):
        flavours.python_for(12)


def test_missing_flavour_environment_says_how_to_make_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = 12 if flavours.own_cuda_major() == 13 else 13
    monkeypatch.delenv(f"FA4_AOT_PYTHON_CU{other}", raising=False)
    monkeypatch.setattr(config, "CHECKOUT_DIR", tmp_path)
    with pytest.raises(BuildError) as e:
        flavours.python_for(other)
    assert f"docker/flavour-venv.sh {other} .venv-cu{other}" in str(e.value)
    assert f"FA4_AOT_PYTHON_CU{other}" in str(e.value)
    venv_python = tmp_path / f".venv-cu{other}" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert flavours.python_for(other) == str(venv_python)  # the checkout's venv is found without configuration


def test_a_venv_python_linking_to_this_one_is_another_interpreter(tmp_path: Path) -> None:
    link = tmp_path / "bin" / "python"
    link.parent.mkdir()
    link.symlink_to(os.path.realpath(sys.executable))  # what a venv's python is
    assert not flavours.is_own(str(link)) and flavours.is_own(sys.executable)


def test_workers_of_another_interpreter_import_this_checkout_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    assert flavours.worker_env()["PYTHONPATH"].split(os.pathsep) == [str(config.CHECKOUT_DIR), "/somewhere"]
