"""The test suite cleans up after itself: a passing run leaves nothing in the temp folder, a failing one keeps
what it made. Regression: a full run left 5 GB in the temp folder (4.6 GB of it fa4-aot's stores and servers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INNER = '''
import pytest

@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    (folder / "object").write_bytes(b"x" * 4096)
    return folder

def test_uses_both(shared, tmp_path):
    (tmp_path / "mine").write_bytes(b"y" * 4096)
    assert FAIL == 0
'''


def _run(tmp_path: Path, fail: int) -> list[Path]:
    """Run a suite of one test that makes a session folder and its own, under this project's configuration and
    plugins, with the temp folders under tmp_path; the files left there."""
    suite = tmp_path / f"suite{fail}"
    (suite / "tests").mkdir(parents=True)
    (suite / "tests" / "test_inner.py").write_text(INNER.replace("FAIL", str(fail)))
    temp = tmp_path / f"temp{fail}"
    temp.mkdir()
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(temp), "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                          str(ROOT / "pyproject.toml"), "--rootdir", str(suite), "-p", "tests.conftest",
                          str(suite / "tests")], capture_output=True, text=True, env=env, cwd=suite, timeout=300)
    assert ran.returncode == (1 if fail else 0), ran.stdout[-3000:] + ran.stderr[-3000:]
    return [p for p in temp.rglob("*") if p.is_file()]


def test_a_passing_run_leaves_no_files_and_a_failing_one_keeps_them(tmp_path: Path) -> None:
    assert _run(tmp_path, 0) == []
    kept = {p.name for p in _run(tmp_path, 1)}
    assert {"object", "mine"} <= kept, kept
