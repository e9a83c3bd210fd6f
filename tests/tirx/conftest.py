"""The TIRx tests' shared fixture: stores that a real `fa4-aot build --family tirx` made, on this CPU host (TVM's
TIRx pipeline in .venv-tirx, nvcc), skipped where either is missing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fa4_aot.errors import BuildError
from fa4_aot.tirx import toolenv
from tests.conftest import run_cli

TirxBuild = Callable[[Path, str], tuple[Path, list[dict]]]


@pytest.fixture(scope="session")
def tirx_build(tmp_path_factory: pytest.TempPathFactory) -> TirxBuild:
    """build(variants, skus) -> (store, the build's --json documents): `fa4-aot build --sku SKUS --family tirx
    --variants VARIANTS` into a new store, once per (variants, skus) in the session; asserts exit 0."""
    made: dict[tuple[Path, str], tuple[Path, list[dict]]] = {}

    def build(variants: Path, skus: str) -> tuple[Path, list[dict]]:
        try:
            toolenv.python()
        except BuildError as e:
            pytest.skip(f"no TIRx environment: {e}")
        if shutil.which("nvcc") is None:
            pytest.skip("nvcc 13.0 is not on PATH: the TIRx family's cubins are made by it")
        if (variants, skus) not in made:
            store = tmp_path_factory.mktemp("tirx") / "store"
            done = run_cli("build", "--sku", skus, "--family", "tirx", "--variants", str(variants), "--json",
                           cache=store, timeout=1800)
            assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
            docs = json.loads(done.stdout)
            made[(variants, skus)] = store, docs if isinstance(docs, list) else [docs]
        return made[(variants, skus)]

    return build
