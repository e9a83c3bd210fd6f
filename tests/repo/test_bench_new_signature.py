"""bench/lean_new_signature.py on a host without a GPU: its arguments parse, and it stops at once with one line
saying it needs a GPU of a SKU (exit 2, as `fa4-aot certify`), before it builds anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "lean_new_signature.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_without_a_gpu_it_says_so_in_one_line_and_builds_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the bench would run")
    done = _run("--out", str(tmp_path / "out.json"), "--work", str(tmp_path / "work"), "--rounds", "1")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lean_new_signature: needs a GPU of a SKU: "), done.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out.json").exists()


def test_before_must_hold_a_checkout(tmp_path: Path) -> None:
    done = _run("--out", str(tmp_path / "out.json"), "--before", str(tmp_path))
    assert done.returncode == 2
    assert f"--before {tmp_path}: no fa4_aot package there" in done.stderr
