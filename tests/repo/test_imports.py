"""The FA4 seam holds: only fa4_aot/fa4/ imports flash_attn, cutlass or quack, and importing the package or its
client loads none of them (a fresh interpreter, so nothing an earlier test imported hides a regression)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

FA4_PACKAGES = ("flash_attn", "cutlass", "quack")
PACKAGE = ROOT / "fa4_aot"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_the_seam_imports_fa4() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_roots(path) & set(FA4_PACKAGES))
        for path in sorted(PACKAGE.rglob("*.py"))
        if PACKAGE / "fa4" not in path.parents
    }
    assert {p: found for p, found in offenders.items() if found} == {}
    assert _imported_roots(PACKAGE / "fa4" / "caches.py") & set(FA4_PACKAGES)  # the scan does see imports


@pytest.mark.parametrize("statement", [
    "import fa4_aot",
    "import fa4_aot.client",
    "import fa4_aot.fa4",
    "import fa4_aot.compile.orchestrator, fa4_aot.remote.push_pull, fa4_aot.client.attention",
    "import fa4_aot.client.installation",
    "from fa4_aot.fa4 import tracking; tracking.current()",
])
def test_importing_loads_no_fa4_module(statement: str) -> None:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = [m for m in json.loads(out.stdout) if m.split(".")[0] in FA4_PACKAGES]
    assert loaded == [], f"{statement!r} imported {loaded[:5]}"


def test_the_check_sees_an_fa4_import() -> None:
    code = "import fa4_aot.fa4.caches\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert any(m.split(".")[0] == "flash_attn" for m in json.loads(out.stdout))
